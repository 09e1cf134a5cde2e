"""Tensor parallelism end to end: TP=2 vectors against transformers fp32 (the independent
reference) and against TP=1, chunked and batched, under forced preemption; per-rank weight
bytes; options that do not combine are refused. TP=4 (4 processes) is marked slow."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.errors import InvalidInputError, ModelLoadError
from embedserve.models.loader import iter_weights, read_model_dir
from embedserve.parallel.runner import TensorParallelRunner
from embedserve.parallel.sharding import padded_vocab
from embedserve.schema import ModelMetadata
from tests.helpers.engine_calls import submit
from tests.helpers.reference import cosine, hf_embed_ids, random_ids
from tests.helpers.tiny_bert import build_encoder
from tests.helpers.tiny_models import build_decoder

FP32_MIN_COSINE = 0.99999
LENGTHS = (1, 40, 700, 1500, 4096)  # one batch, chunked at the 256-token budget


@pytest.fixture(scope="module")
def llama_kv1_dir(models_dir: Path) -> Path:
    """One KV head: fewer than the ranks, so every rank keeps a copy of it."""
    return build_decoder(models_dir / "llama-kv1", "llama", kv_heads=1, seed=4)


def _workers(engine: Engine) -> TensorParallelRunner:
    workers = engine._loop.parts.workers
    assert workers is not None
    return workers


def _parity(path: Path, pooling: str, world: int, **options: object) -> tuple[float, float]:
    """(min cosine vs transformers, min cosine vs TP=1) over LENGTHS in one batch."""
    seqs = [random_ids(n, seed=n + world) for n in LENGTHS]
    ref = hf_embed_ids(path, seqs, pooling=pooling)
    with Engine.from_pretrained(path, max_num_batched_tokens=256, **options) as one:
        base = one.embed(seqs)
    with Engine.from_pretrained(
        path, max_num_batched_tokens=256, tensor_parallel_size=world, **options
    ) as tp:
        got = tp.embed(seqs)
        assert tp.stats()["steps"] >= sum(LENGTHS) // 256  # chunked
    return float(cosine(got, ref).min()), float(cosine(got, base).min())


@pytest.mark.parametrize(
    ("fixture", "pooling"),
    [
        ("qwen3_dir", "lasttoken"),
        pytest.param("qwen2_dir", "mean", marks=pytest.mark.slow),  # CI time: qwen3 stays in CI
        pytest.param("llama_kv1_dir", "lasttoken", marks=pytest.mark.slow),
    ],
)
def test_tp2_matches_transformers_and_tp1(fixture: str, pooling: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    vs_ref, vs_tp1 = _parity(path, pooling, 2)
    assert vs_ref >= FP32_MIN_COSINE and vs_tp1 >= FP32_MIN_COSINE, (vs_ref, vs_tp1)


@pytest.mark.slow
def test_tp2_bf16(qwen3_dir: Path) -> None:
    """bf16 ranks sum bf16 partials (parallel/group.py): the bf16 bar against fp32."""
    vs_ref, vs_tp1 = _parity(qwen3_dir, "lasttoken", 2, dtype="bfloat16")
    assert vs_ref >= 0.999 and vs_tp1 >= 0.999, (vs_ref, vs_tp1)


@pytest.mark.slow
def test_tp4_with_kv_heads_replicated(qwen3_dir: Path) -> None:
    vs_ref, vs_tp1 = _parity(qwen3_dir, "lasttoken", 4)  # 2 kv heads on 4 ranks
    assert vs_ref >= FP32_MIN_COSINE and vs_tp1 >= FP32_MIN_COSINE, (vs_ref, vs_tp1)


BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4  # tiny Qwen3: layers x (k, v) x 16 x kv heads x head_dim x 4 B


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_tp2_under_forced_preemption(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n + 5) for n in (900, 1200, 400, 1250, 1260, 1270)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    with Engine.from_pretrained(
        qwen3_dir,
        tensor_parallel_size=2,
        max_num_batched_tokens=128,
        kv_cache_memory=80 * BLOCK_BYTES,
        max_model_len=1280,
    ) as engine:
        batch_futs, _ = submit(engine, seqs[:3], priority="batch")
        while engine.stats()["tokens_computed"] < 300:
            time.sleep(0.005)
        online = engine.embed(seqs[3:])
        batch = np.stack([f.result().vector.numpy() for f in batch_futs])  # type: ignore[union-attr]
        stats = engine.stats()
        meta = ModelMetadata.from_engine_config(engine.config, "tiny", None, "f")
    assert stats["preemptions"] > 0 and stats["kv_blocks_used"] == 0
    assert cosine(np.concatenate([batch, online]), ref).min() >= FP32_MIN_COSINE
    assert meta.backend_profile == "cpu-fp32-tp2"


@pytest.fixture(scope="module")
def qwen3_tp2(qwen3_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(qwen3_dir, tensor_parallel_size=2) as engine:
        yield engine


def test_each_rank_holds_half_the_weights(qwen3_dir: Path, qwen3_tp2: Engine) -> None:
    total = replicated = 0
    for name, t in iter_weights(read_model_dir(qwen3_dir).weight_files):
        if name.startswith("lm_head."):
            continue
        nbytes = t.numel() * 4  # the engine runs float32
        total += nbytes
        replicated += nbytes if "norm" in name else 0
    per_rank = _workers(qwen3_tp2).rank_weight_bytes
    assert len(per_rank) == 2
    share = (total - replicated) / 2
    for nbytes in per_rank:  # the vocab padding's few rows are the only extra
        assert share * 0.9 <= nbytes - replicated <= share * 1.1, (nbytes, total)


def test_padding_ids_are_refused(qwen3_tp2: Engine) -> None:
    vocab = qwen3_tp2.config.model.vocab_size
    assert padded_vocab(vocab, 2) > vocab + 1  # ids vocab .. padded-1 are padding rows
    for bad in (vocab, padded_vocab(vocab, 2) - 1):
        with pytest.raises(InvalidInputError, match=str(bad)):
            qwen3_tp2.embed([[1, 2, bad]])
    assert qwen3_tp2.embed([[1, 2, vocab - 1]]).shape == (1, 64)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tensor_parallel_size": 3}, "tensor_parallel_size 3 does not divide the 4 attention heads"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1"),
        ({"tensor_parallel_size": 2, "deterministic": True}, "deterministic is not supported"),
        ({"tensor_parallel_size": 2, "layer_major_tokens": 4096}, "layer_major_tokens is not supported"),
        ({"tensor_parallel_size": 2, "token_buckets": True}, "token_buckets is not supported"),
    ],
)
def test_options_that_do_not_combine_are_refused(
    qwen3_dir: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ModelLoadError, match=message):
        Engine.from_pretrained(qwen3_dir, **options)


def test_an_encoder_is_refused(tmp_path: Path) -> None:
    bert = build_encoder(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match=r"applies to decoder models.*encoder"):
        Engine.from_pretrained(bert, tensor_parallel_size=2)


def test_serve_takes_the_option() -> None:
    from embedserve.cli import build_parser
    from embedserve.server.cli import _settings

    args = build_parser().parse_args(["serve", "--model", "/m", "--tensor-parallel-size", "2"])
    assert _settings(args).engine.tensor_parallel_size == 2
    assert _settings(build_parser().parse_args(["serve", "--model", "/m"])).engine.tensor_parallel_size == 1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tensor-parallel-size", "0"])
