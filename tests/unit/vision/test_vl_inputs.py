"""Qwen3-VL inputs: M-RoPE positions pinned to transformers' get_rope_index, chunk cuts,
image limits and refusals, token counts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.errors import InvalidInputError
from embedserve.vision.image import ImageTooLargeError, ProcessedImage
from embedserve.vision.state import ImageSpan, MultimodalState
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.tiny_vl import IMAGE_TOKEN_ID, _hf, encoded, image


def test_positions_match_transformers_rope_index(qwen3_vl_dir: Path) -> None:
    parts = [image(64, 200, seed=1), "between", image(300, 100, seed=2), "after", image(96, 96, seed=3)]
    with Engine.from_pretrained(qwen3_vl_dir) as engine:
        tok = engine.renderer.text([parts])[0]
    assert tok.multimodal is not None
    model = _hf(str(qwen3_vl_dir)).model
    ids = torch.tensor([tok.token_ids])
    grids = torch.tensor([list(s.image.grid) for s in tok.multimodal.spans])
    ref, _ = model.get_rope_index(ids, (ids == IMAGE_TOKEN_ID).int(), image_grid_thw=grids)
    assert np.array_equal(tok.multimodal.positions, ref[:, 0].numpy())


def _state(length: int, starts: list[int]) -> MultimodalState:
    img = ProcessedImage(np.zeros((16, 1), dtype=np.float32), (1, 4, 6), 2)  # 2 x 3 = 6 tokens
    return MultimodalState.of(length, [ImageSpan(s, img) for s in starts])


def test_positions_by_hand() -> None:
    st = _state(12, [2])
    # text 0 1 | image (2, 2+r, 2+c) for a 2 x 3 grid | text resumes at 2 + max(2, 3) = 5
    assert st.positions.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8],
    ]


def test_cut_moves_before_an_image() -> None:
    st = _state(20, [4, 12])  # images at [4, 10) and [12, 18)
    assert st.cut(0, 4) == 4 and st.cut(0, 5) == 4 and st.cut(0, 9) == 4  # before the first image
    assert st.cut(0, 10) == 10 and st.cut(0, 11) == 11  # the whole first image, or more text
    assert st.cut(10, 5) == 2  # into the second image: up to its start
    assert st.cut(4, 3) == 0  # a chunk starting at an image that does not fit: nothing
    assert st.images_in(0, 12) == [0] and st.images_in(10, 8) == [1] and st.images_in(10, 2) == []


def test_text_only_model_refuses_images_naming_it(qwen3_dir: Path) -> None:
    with Engine.from_pretrained(qwen3_dir) as engine:
        for item in (["text", image(32, 32, seed=0)], encoded(image(32, 32, seed=0))):
            with pytest.raises(InvalidInputError, match=f"model {qwen3_dir.name} takes text only"):
                engine.embed([item])


def test_image_limits_and_bad_images(qwen3_vl_dir: Path) -> None:
    png = encoded(image(64, 64, seed=0))
    with Engine.from_pretrained(
        qwen3_vl_dir, max_images_per_input=2, max_image_pixels=100_000, max_num_batched_tokens=40
    ) as engine:
        with pytest.raises(InvalidInputError, match="3 images in one input exceed the limit of 2"):
            engine.embed([[png, png, png]])
        with pytest.raises(ImageTooLargeError, match=r"input 0: .*exceeds the limit of 100000 pixels"):
            engine.embed([[encoded(image(400, 300, seed=1))]])
        with pytest.raises(InvalidInputError, match="input 1: image cannot be decoded"):
            engine.embed(["fine", [b"not an image"]])
        with pytest.raises(InvalidInputError, match="exceeds the token budget"):
            engine.embed([[encoded(image(300, 300, seed=2))]])  # 64 tokens > a 40-token step
        with pytest.raises(InvalidInputError, match="vision special tokens"):
            engine.embed(["<|image_pad|>"])
        out = embed_outputs(engine, [["a picture:", png]])[0]  # the engine still serves
    assert out.num_tokens == len(engine.renderer.text([["a picture:", png]])[0].token_ids)
    assert out.num_tokens > 4 + 20  # 4 image tokens (64 x 64) and the chat format around them


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_transformers_4_config_format_loads_the_same(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    """Released Qwen3-VL directories (transformers 4.57) write `rope_theta` and `rope_scaling`
    (with mrope_section) in text_config and no vision rope_parameters."""
    old = tmp_path / "old_format"
    shutil.copytree(qwen3_vl_dir, old)
    cfg = json.loads((old / "config.json").read_text())
    rope = cfg["text_config"].pop("rope_parameters")
    cfg["text_config"]["rope_theta"] = rope.pop("rope_theta")
    cfg["text_config"]["rope_scaling"] = rope
    cfg["vision_config"].pop("rope_parameters")
    (old / "config.json").write_text(json.dumps(cfg))
    parts = ["text", image(96, 64, seed=4), "more"]
    with Engine.from_pretrained(qwen3_vl_dir) as a, Engine.from_pretrained(old) as b:
        assert np.array_equal(a.embed([parts]), b.embed([parts]))


def test_one_image_alone_is_one_input(qwen3_vl_dir: Path) -> None:
    img = image(96, 64, seed=8)
    with Engine.from_pretrained(qwen3_vl_dir) as engine:
        alone, as_bytes, listed = engine.embed(img), engine.embed(encoded(img)), engine.embed([[img]])
    assert alone.shape == as_bytes.shape == listed.shape == (1, 64)
    assert np.array_equal(alone, listed) and np.array_equal(alone, as_bytes)  # PNG is lossless


def test_tensor_parallelism_is_refused_for_a_multimodal_model(qwen3_vl_dir: Path) -> None:
    from embedserve.engine.builder import build_engine
    from embedserve.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"multimodal \(Qwen3-VL\).*tensor_parallel_size 1"):
        build_engine(qwen3_vl_dir, tensor_parallel_size=2)
