"""`embedserve parity` on text + image inputs: the `images` dataset, transformers' Qwen3VLModel as
`hf:` reference, the engine and the http backend as candidates, the `multimodal` gate profile."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from embedserve import Engine
from embedserve.embedders.http_source import HttpSource
from embedserve.embedders.modeldir import TokenCounter
from embedserve.embedders.spec import parse_spec
from embedserve.embedders.vl import VLReferenceSource
from embedserve.parity.datasets import DatasetContext, Parts, load_dataset
from embedserve.parity.options import ParityError
from embedserve.parity.runner import Settings, run
from tests.helpers.inprocess import server_client
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import hf_vl_embed

SPEC = "images?count=8"


def _ctx(model_dir: Path) -> DatasetContext:
    counter = TokenCounter(model_dir)
    images = counter.image_tokens if counter.image is not None else None
    return DatasetContext(model_dir, counter.count, counter.ordinary_ids, None, False, images)


@pytest.fixture(scope="module")
def vl_ctx(qwen3_vl_dir: Path) -> DatasetContext:
    return _ctx(qwen3_vl_dir)


def test_images_dataset_is_deterministic_and_mixes_kinds(vl_ctx: DatasetContext) -> None:
    a = load_dataset(SPEC, vl_ctx)
    b = load_dataset(SPEC, vl_ctx)
    assert a.corpus == b.corpus  # same PNG bytes, same captions
    items = list(a.corpus.values())
    assert all(isinstance(i, Parts) for i in items)
    counts = sorted({i.num_images for i in items if isinstance(i, Parts)})
    assert counts == [0, 1, 2]  # text only, one image, two interleaved
    images = [p for i in items if isinstance(i, Parts) for p in i.parts if isinstance(p, bytes)]
    sizes = {Image.open(io.BytesIO(p)).size for p in images}
    assert {(64, 64), (128, 96), (200, 150)} <= sizes
    assert load_dataset("images?count=8&seed=1", vl_ctx).corpus != a.corpus


def test_images_dataset_needs_a_multimodal_model(vl_ctx: DatasetContext) -> None:
    text_only = DatasetContext(vl_ctx.data_dir, vl_ctx.count_tokens, vl_ctx.ordinary_ids, None)
    with pytest.raises(ParityError, match="needs a multimodal model"):
        load_dataset(SPEC, text_only)
    with pytest.raises(ParityError, match="WxH"):
        load_dataset("images?sizes=64by64", vl_ctx)


def test_token_lengths_count_image_tokens(qwen3_vl_dir: Path, vl_ctx: DatasetContext) -> None:
    counter = TokenCounter(qwen3_vl_dir)
    png = load_dataset(SPEC, vl_ctx).corpus["image-1"]
    assert isinstance(png, Parts)
    with_image = counter.count_parts(png.parts, "")
    assert with_image == counter.count_parts(("",), "") + 2 + 12  # vision start/end + 12 (128 x 96)


# No system turn: the instruction folded into the text (a template unlike the built-in format).
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}Task: {{ m['content'][0]['text'] }}\n"
    "{% else %}User: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}Embedding:{% endif %}"
)


def test_the_reference_renders_the_directory_chat_template(
    qwen3_vl_dir: Path, vl_ctx: DatasetContext, tmp_path: Path
) -> None:
    templated = tmp_path / "templated"
    shutil.copytree(qwen3_vl_dir, templated)
    (templated / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    items = list(load_dataset(SPEC, vl_ctx).corpus.values())[2:4]
    ref = VLReferenceSource(parse_spec(f"hf:{templated}", "parity"))
    assert ref.ref.prompt(["x"], "y").startswith("Task: y")
    with Engine.from_pretrained(templated) as engine:
        got = engine.embed([list(i.parts) for i in items if isinstance(i, Parts)])
    assert cosine(got, ref.embed(items, "")).min() >= 0.99999


def _perturbed(src: Path, dst: Path) -> Path:
    """The same model with noise on its vision tower only: text-only vectors unchanged."""
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        gen = torch.Generator().manual_seed(0)
        for name, t in tensors.items():
            if name.startswith(("visual.", "model.visual.")) and t.is_floating_point():
                tensors[name] = t + 0.3 * t.std() * torch.randn(t.shape, generator=gen)
        save_file(tensors, f, metadata={"format": "pt"})
    return dst


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_parity_run_on_images(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    def gate(candidate: str) -> tuple[bool, dict[str, float]]:
        settings = Settings(
            reference=f"hf:{qwen3_vl_dir}",
            candidate=candidate,
            datasets=[SPEC],
            gate_profile="multimodal",
            reference_cache=tmp_path / "cache",
            progress=False,
        )
        outcome = run(settings)
        assert outcome.report["gate"]["profile"] == "multimodal"
        return outcome.passed, outcome.report["datasets"]["images"]["buckets"]["overall"]["vector_cosine"]

    passed, fp32 = gate(f"engine:{qwen3_vl_dir}?max_num_batched_tokens=64")  # chunk cuts at images
    # (bf16 vs this reference passes the profile: test_vl_parity.py, and docs/multimodal.md's run)
    assert passed and fp32["min"] >= 0.99999, fp32
    wrong = _perturbed(qwen3_vl_dir, tmp_path / "perturbed")
    passed, bad = gate(f"engine:{wrong}")
    assert not passed and bad["p01"] < 0.995, bad
    print(f"images parity cosine fp32 {fp32}, perturbed tower {bad}")


def test_http_backend_sends_content_items(qwen3_vl_dir: Path, vl_ctx: DatasetContext) -> None:
    items = list(load_dataset(SPEC, vl_ctx).corpus.values())[:4]
    with server_client(qwen3_vl_dir) as client:
        backend = HttpSource(parse_spec("http://testserver?model=m", "parity"))
        backend.client.http = client  # TestClient: httpx over the ASGI app
        backend.model_name = str(client.get("/v1/models").json()["data"][0]["id"])
        got = backend.embed(items, "Find the picture.")
        assert backend.usage_tokens > 4 * 20  # image tokens counted by the server
    backend_ref = VLReferenceSource(parse_spec(f"hf:{qwen3_vl_dir}", "parity"))
    ref = backend_ref.embed(items, "Find the picture.")
    assert cosine(got, ref).min() >= 0.99999
    item = items[3]  # text, image, text, image: the parity reference is the tests' reference
    assert isinstance(item, Parts) and item.num_images == 2
    parts = [p if isinstance(p, str) else Image.open(io.BytesIO(p)).convert("RGB") for p in item.parts]
    assert cosine(ref[3:], hf_vl_embed(qwen3_vl_dir, parts, "Find the picture.")[None])[0] >= 0.99999
