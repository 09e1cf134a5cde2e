"""The tiny Qwen3-VL fixture is sensitive enough: two plausible wrong variants of the engine
fall clearly below the fp32 parity bar that the right one passes (test_vl_parity.py).

- M-RoPE: text after an image resuming at start + its token count (the token index) instead
  of the image's max position + 1;
- DeepStack: the rows added at offsets counted from the chunk's start, not the image's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.models.qwen3_vl.model import Qwen3VLModel
from embedserve.vision import state
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import hf_vl_embed, image

WRONG_BELOW = 0.99  # the right engine reaches >= 0.99999; the multimodal gate is 0.995
PARTS = ["text before", image(192, 128, seed=11), "text after the image, several tokens of it"]


def _engine_vs_reference(path: Path, budget: int = 24) -> float:
    with Engine.from_pretrained(path, max_num_batched_tokens=budget) as engine:
        got = engine.embed([PARTS])[0]
    return float(cosine(got[None], hf_vl_embed(path, PARTS)[None])[0])


def test_right_variant_passes(qwen3_vl_dir: Path) -> None:
    assert _engine_vs_reference(qwen3_vl_dir) >= 0.99999


def test_text_after_image_at_token_index_is_caught(
    qwen3_vl_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right_positions = state.mrope_positions

    def token_index_positions(length: int, spans: list[state.ImageSpan]) -> np.ndarray:
        pos = np.broadcast_to(np.arange(length, dtype=np.int64), (3, length)).copy()
        for span in spans:  # image rows as the right variant, text positions = token index
            right = right_positions(span.end, [span])
            pos[:, span.start : span.end] = right[:, span.start : span.end]
        return pos

    monkeypatch.setattr(state, "mrope_positions", token_index_positions)
    assert _engine_vs_reference(qwen3_vl_dir) < WRONG_BELOW


def test_deepstack_at_wrong_offset_is_caught(qwen3_vl_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepStack rows counted from the chunk's first row instead of the image's (right when
    the image opens the chunk, wrong here: one chunk with text before the image)."""

    def wrong(self, input_ids, positions, kv_caches, meta, output_rows=None, vision=None):  # type: ignore[no-untyped-def]
        x = self.embed_tokens(input_ids)
        deep: list[torch.Tensor] = []
        if vision is not None:
            x[vision.rows] = vision.main.to(x.dtype)
            deep = vision.deepstack
            late = vision.rows - vision.rows[0]  # the bug
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos_sin, kv_caches[i], meta)
            if i < len(deep):
                x[late] = x[late] + deep[i].to(x.dtype)
        return self.norm(x.index_select(0, output_rows))

    monkeypatch.setattr(Qwen3VLModel, "forward", wrong)
    assert _engine_vs_reference(qwen3_vl_dir, budget=512) < WRONG_BELOW
