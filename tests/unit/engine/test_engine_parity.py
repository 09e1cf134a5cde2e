"""fp32 engine vs the Hugging Face reference on the same directory (never engine vs itself)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.tokenizer import Truncate
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.reference import cosine, hf_embed_ids, random_ids, st_embed

FP32_MIN_COSINE = 0.99999
LENGTHS = [1, 2, 15, 16, 17, 100, 511, 1000, 2049, 4096]


@pytest.fixture(scope="module")
def qwen3_seqs_and_ref(qwen3_dir: Path) -> tuple[list[list[int]], np.ndarray]:
    seqs = [random_ids(n, seed=n) for n in LENGTHS]
    return seqs, hf_embed_ids(qwen3_dir, seqs)


@pytest.mark.parametrize("budget", [7, 64, 512, 8192])
def test_qwen3_token_ids_match_reference_at_every_budget(
    qwen3_dir: Path, qwen3_seqs_and_ref: tuple[list[list[int]], np.ndarray], budget: int
) -> None:
    seqs, ref = qwen3_seqs_and_ref
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=budget) as engine:
        got = engine.embed(seqs)
        stats = engine.stats()
    assert got.dtype == np.float32 and got.shape == ref.shape
    cos = cosine(got, ref)
    assert cos.min() >= FP32_MIN_COSINE, dict(zip(LENGTHS, cos.round(7), strict=True))
    if budget < 4096:  # the budget really forced chunks
        assert stats["steps"] >= sum(LENGTHS) // budget


@pytest.mark.parametrize(
    ("fixture", "pooling", "normalize"),
    [("qwen2_dir", "mean", True), ("llama_dir", "cls", False), ("mistral_dir", "lasttoken", True)],
)
def test_other_decoders_match_reference(
    request: pytest.FixtureRequest, fixture: str, pooling: str, normalize: bool
) -> None:
    path: Path = request.getfixturevalue(fixture)
    seqs = [random_ids(n, seed=7 * n) for n in (1, 33, 700, 2500)]
    ref = hf_embed_ids(path, seqs, pooling=pooling, normalize=normalize)
    for budget in (64, 4096):
        with Engine.from_pretrained(path, max_num_batched_tokens=budget) as engine:
            got = engine.embed(seqs)
        assert cosine(got, ref).min() >= FP32_MIN_COSINE
        if not normalize:  # un-normalized vectors must match in scale too
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)


def test_text_with_query_prompt_matches_sentence_transformers(qwen3_dir: Path) -> None:
    docs = ["hello world", "Rotary position embeddings rotate query and key pairs. " * 40, "x"]
    queries = ["what is rope?", "how are long documents embedded"]
    # Without the prefix cache: the literal prompt's run would start from the named one's
    # blocks, equal to rounding only, and this checks the two give the same ids, bit for bit.
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=64, enable_prefix_caching=False) as engine:
        got_docs = engine.embed(docs)
        got_queries = engine.embed(queries, prompt_name="query")
        got_literal = engine.embed(queries, prompt=engine.config.prompts["query"])
    assert cosine(got_docs, st_embed(qwen3_dir, docs)).min() >= FP32_MIN_COSINE
    ref_q = st_embed(qwen3_dir, queries, prompt_name="query")
    assert cosine(got_queries, ref_q).min() >= FP32_MIN_COSINE
    np.testing.assert_array_equal(got_literal, got_queries)
    # The prompt really changes the vector (it is not silently dropped).
    assert cosine(got_queries, st_embed(qwen3_dir, queries)).max() < 0.999


def test_eos_is_appended_once_by_the_tokenizer(qwen3_dir: Path) -> None:
    with Engine.from_pretrained(qwen3_dir) as engine:
        (out,) = embed_outputs(engine, ["hello world"])
        ids = engine.tokenizer.encode("hello world", 100, Truncate.ERROR).token_ids
    assert ids[-1] == 151643 and ids.count(151643) == 1
    assert out.num_tokens == len(ids) == 3


def test_matryoshka_dimensions_slice_then_normalize(qwen3_dir: Path) -> None:
    seqs = [random_ids(50, seed=1), random_ids(300, seed=2)]
    with Engine.from_pretrained(qwen3_dir) as engine:
        full = engine.embed(seqs, normalize=False)
        small = engine.embed(seqs, dimensions=16)
    assert small.shape == (2, 16)
    want = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(small, want, rtol=1e-5, atol=1e-6)
