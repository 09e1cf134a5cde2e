"""bfloat16 engine vs the float32 Hugging Face reference."""

from __future__ import annotations

from pathlib import Path

from embedserve import Engine
from tests.helpers.reference import cosine, hf_embed_ids, random_ids


def test_bf16_matches_fp32_reference_at_4k(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n + 9) for n in (10, 700, 4096)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    with Engine.from_pretrained(qwen3_dir, dtype="bfloat16", max_num_batched_tokens=512) as engine:
        got = engine.embed(seqs)
    cos = cosine(got, ref)
    assert cos.min() >= 0.999, cos
    assert cos.min() < 0.9999999  # it really ran in bf16
