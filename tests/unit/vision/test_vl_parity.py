"""Qwen3-VL through the engine vs transformers' Qwen3VLModel (fp32, post-norm last token):
text only, one image, several interleaved, an image at the very start / end, chunk cuts just
before / at / just after an image start, batched vs alone, forced preemption, both checkpoint
layouts, Matryoshka; bf16 against the multimodal gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.request import EmbedParams, Priority, Request
from embedserve.scheduler.output import SchedulerOutput
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import build_vl, hf_vl_embed, image

FP32_MIN_COSINE = 0.99999
Parts = list[str | Image.Image]

CASES: dict[str, Parts] = {
    "text only": ["A page of a quarterly report: revenue grew 12% year over year."],
    "one image": ["The chart below: ", image(200, 150, seed=1), " shows revenue by quarter."],
    "interleaved": [
        "a",
        image(100, 100, seed=2),
        "b c d",
        image(130, 60, seed=3),
        "e f",
        image(64, 200, seed=4),
    ],
    "image at start": [image(160, 96, seed=5), "caption after the image"],
    "image at end": ["caption before the image", image(300, 100, seed=6)],
}


def _reference(path: Path, cases: dict[str, Parts]) -> np.ndarray:
    return np.stack([hf_vl_embed(path, parts) for parts in cases.values()])


def _record_chunks(engine: Engine) -> list[list[tuple[int, int, int]]]:
    """Every step's (request, start, tokens), recorded on the engine's own runner."""
    runner = engine._loop.core.runner
    steps: list[list[tuple[int, int, int]]] = []
    execute = runner.execute

    def spy(out: SchedulerOutput) -> Any:
        steps.append([(c.request_id, c.start, c.num_tokens) for c in out.chunks])
        return execute(out)

    runner.execute = spy  # type: ignore[method-assign]
    return steps


def test_cases_alone_and_batched_match_transformers(qwen3_vl_dir: Path) -> None:
    ref = _reference(qwen3_vl_dir, CASES)
    with Engine.from_pretrained(qwen3_vl_dir, max_num_batched_tokens=512) as engine:
        alone = np.stack([engine.embed([parts])[0] for parts in CASES.values()])
        batched = engine.embed(list(CASES.values()))
    for name, a, b, r in zip(CASES, alone, batched, ref, strict=True):
        assert cosine(a[None], r[None])[0] >= FP32_MIN_COSINE, name
        assert cosine(b[None], r[None])[0] >= FP32_MIN_COSINE, name


def test_text_through_the_multimodal_path_is_the_plain_text(qwen3_vl_dir: Path) -> None:
    text = "the same text, either way"
    with Engine.from_pretrained(qwen3_vl_dir) as engine:
        plain, as_parts = engine.embed([text, [text]])
        out = embed_outputs(engine, [text])[0]
    assert np.array_equal(plain, as_parts)
    assert cosine(plain[None], hf_vl_embed(qwen3_vl_dir, [text])[None])[0] >= FP32_MIN_COSINE
    assert out.num_tokens == len(engine.renderer.text([text])[0].token_ids)


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_chunk_cuts_around_an_image_start(qwen3_vl_dir: Path) -> None:
    parts: Parts = ["some text before the image, long enough", image(128, 96, seed=7), "and text after it"]
    ref = hf_vl_embed(qwen3_vl_dir, parts)
    with Engine.from_pretrained(qwen3_vl_dir) as probe:
        tok = probe.renderer.text([parts])[0]
    assert tok.multimodal is not None
    span = tok.multimodal.spans[0]
    s, n_img = span.start, span.image.num_tokens
    assert n_img == 12 and s > n_img + 2
    for budget in (s - 1, s, s + 1, s + n_img - 1, n_img):
        with Engine.from_pretrained(qwen3_vl_dir, max_num_batched_tokens=budget) as engine:
            steps = _record_chunks(engine)
            got = engine.embed([parts])[0]
        chunks = [(start, n) for step in steps for _, start, n in step]
        for start, n in chunks:  # no chunk holds part of the image
            assert start + n <= s or start >= span.end or (start <= s and start + n >= span.end), budget
        if s < budget < s + n_img:
            assert chunks[0] == (0, s)  # the cut inside the image moved before it
        assert cosine(got[None], ref[None])[0] >= FP32_MIN_COSINE, budget


def _requests(parts_list: list[Parts], engine_parts: Any, priority: Priority, first_id: int) -> list[Request]:
    prompter = engine_parts.prompter
    out = []
    for i, parts in enumerate(parts_list):
        ids, state = prompter.encode(parts, "", 4096)
        out.append(Request(first_id + i, ids, EmbedParams(), PoolingMethod.LAST, priority, multimodal=state))
    return out


def test_forced_preemption_of_a_multimodal_request(qwen3_vl_dir: Path) -> None:
    """Driven step by step so the preemption is certain; the tower re-runs after it."""
    big: Parts = ["x " * 60, image(256, 256, seed=8), "y " * 60, image(200, 160, seed=9), "end"]
    small: list[Parts] = [["q " * 40, image(96, 96, seed=10 + i), "tail"] for i in range(3)]
    ref = np.stack([hf_vl_embed(qwen3_vl_dir, p) for p in [big, *small]])
    # 3 layers x (k, v) x 16 slots x 2 kv heads x 64 x 4 B per block; 16 blocks = 256 tokens
    block = 3 * 2 * 16 * 2 * 64 * 4
    parts = build_engine(qwen3_vl_dir, max_num_batched_tokens=64, kv_cache_memory=16 * block)
    core = parts.core
    tower_runs = []
    run_tower = core.runner.run_tower

    def spy(todo: Any) -> None:
        tower_runs.extend(k for _, k in todo)
        run_tower(todo)

    core.runner.run_tower = spy  # type: ignore[method-assign]
    (long_req,) = _requests([big], parts, Priority.BATCH, 0)
    assert 130 < long_req.num_prompt_tokens <= 256
    core.add(long_req)
    for _ in range(3):
        assert core.step() == []
    assert long_req.num_computed_tokens >= 128 and long_req.mm is not None and long_req.mm.encoder_cache
    for r in _requests(small, parts, Priority.ONLINE, 1):
        core.add(r)
    vectors: dict[int, np.ndarray] = {}
    for _ in range(200):
        for fin in core.step():
            assert fin.error is None and fin.vector is not None
            vectors[fin.request.request_id] = fin.vector.numpy()
        if not core.has_work:
            break
    assert long_req.num_preemptions > 0
    assert tower_runs.count(0) >= 2  # the first image's tower ran again after the preemption
    assert not long_req.mm.encoder_cache  # released when it finished
    assert core.stats()["kv_blocks_used"] == 0
    got = np.stack([vectors[i] for i in range(4)])
    assert cosine(got, ref).min() >= FP32_MIN_COSINE


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_generation_checkpoint_layout(models_dir: Path) -> None:
    path = build_vl(models_dir / "qwen3_vl_generation", layout="generation", seed=3)
    cases = {k: CASES[k] for k in ("text only", "interleaved")}
    with Engine.from_pretrained(path, max_num_batched_tokens=48) as engine:
        got = engine.embed(list(cases.values()))
    assert cosine(got, _reference(path, cases)).min() >= FP32_MIN_COSINE


def test_matryoshka_dimensions(qwen3_vl_dir: Path) -> None:
    parts = CASES["one image"]
    with Engine.from_pretrained(qwen3_vl_dir) as engine:
        full = engine.embed([parts])[0]
        cut = engine.embed([parts], dimensions=16)[0]
    expect = full[:16] / np.linalg.norm(full[:16])
    assert cut.shape == (16,) and cosine(cut[None], expect[None])[0] >= FP32_MIN_COSINE


def test_bf16_passes_the_multimodal_gate(qwen3_vl_dir: Path) -> None:
    cases = dict(CASES)
    for i in range(7):
        cases[f"mixed {i}"] = [
            f"document {i}: " + "words " * (5 * i),
            image(64 + 40 * i, 200 - 15 * i, seed=20 + i),
        ]
    ref = _reference(qwen3_vl_dir, cases)
    with Engine.from_pretrained(qwen3_vl_dir, dtype="bfloat16", max_num_batched_tokens=64) as engine:
        got = engine.embed(list(cases.values()))
    cos = cosine(got, ref)
    assert np.quantile(cos, 0.01) >= 0.995 and np.quantile(cos, 0.5) >= 0.999, cos
