"""Token buckets: sizes, padding, and whole engines whose steps run padded (CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.attention.cpu import paged_attention
from embedserve.attention.cuda import VarlenAttention, lower_right_attention
from embedserve.attention.metadata import AttentionFn
from embedserve.engine.builder import build_engine
from embedserve.engine.engine import Engine
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput
from embedserve.worker.bucketed_runner import BucketedModelRunner
from embedserve.worker.buckets import bucket_for, pad_step_inputs, token_buckets
from embedserve.worker.input_batch import build_step_inputs
from tests.helpers.reference import random_ids
from tests.helpers.varlen_reference import reference_varlen


def test_token_buckets() -> None:
    assert token_buckets(8192) == (16, 32, 64, 128, 256, 512, *range(1024, 8193, 1024))
    assert token_buckets(100) == (16, 32, 64, 100)
    assert token_buckets(3000, min_bucket=256) == (256, 512, 1024, 2048, 3000)
    assert token_buckets(8) == (8,)
    with pytest.raises(ValueError, match="positive"):
        token_buckets(0)


def test_bucket_for() -> None:
    buckets = token_buckets(8192)
    assert [bucket_for(n, buckets) for n in (1, 16, 17, 1000, 1025, 8192)] == [16, 16, 32, 1024, 2048, 8192]
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        bucket_for(8193, buckets)
    with pytest.raises(ValueError, match="at least one token"):
        bucket_for(0, buckets)


def test_pad_step_inputs() -> None:
    step = SchedulerOutput(step=0, chunks=[ScheduledChunk(7, 16, [5, 6, 7], [2, 4], (2, 3))])
    inputs = build_step_inputs(step, 16, torch.device("cpu"))
    padded = pad_step_inputs(inputs, 8)
    assert padded.input_ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert padded.positions.tolist() == [16, 17, 18, 0, 0, 0, 0, 0]
    assert padded.meta.slot_mapping is not None
    assert padded.meta.slot_mapping.tolist() == [64, 65, 66, -1, -1, -1, -1, -1]
    assert padded.meta.seqs == inputs.meta.seqs  # padding joins no sequence
    assert padded.output_rows.tolist() == inputs.output_rows.tolist() == [2]
    assert pad_step_inputs(inputs, 3) is inputs
    with pytest.raises(ValueError, match="cannot pad"):
        pad_step_inputs(inputs, 2)


@pytest.fixture
def route(request: pytest.FixtureRequest) -> AttentionFn:
    """A CUDA route for the engine's decoder (as on a GPU)."""
    fn: AttentionFn = request.param
    return fn


SEQS = [random_ids(n, i) for i, n in enumerate([5, 300, 700, 77, 513])]


def _embed(
    path: Path, route: AttentionFn = paged_attention, buckets: bool = False, backend: str | None = None
) -> np.ndarray:
    parts = build_engine(
        path,
        max_num_batched_tokens=256,
        kv_cache_memory=1 << 22,
        token_buckets=buckets,
        compile_backend=backend,
        attention=route,
    )
    assert isinstance(parts.core.runner, BucketedModelRunner) == (buckets or backend is not None)
    with Engine(parts) as engine:
        return engine.embed(SEQS)


@pytest.fixture(scope="module")
def plain_vectors(qwen3_dir: Path) -> np.ndarray:
    return _embed(qwen3_dir)  # the CPU route (`paged_attention`), chunked at 256 tokens


@pytest.mark.parametrize(
    "route",
    [paged_attention, lower_right_attention, VarlenAttention(reference_varlen)],
    indirect=True,
    ids=["cpu", "lr", "varlen"],
)
def test_routes_and_buckets_give_the_same_vectors(
    qwen3_dir: Path, plain_vectors: np.ndarray, route: AttentionFn
) -> None:
    np.testing.assert_allclose(_embed(qwen3_dir, route), plain_vectors, atol=2e-5)
    np.testing.assert_allclose(_embed(qwen3_dir, route, buckets=True), plain_vectors, atol=2e-5)


@pytest.mark.parametrize("route", [lower_right_attention], indirect=True, ids=["lr"])
def test_compiled_buckets_give_the_same_vectors(
    qwen3_dir: Path, plain_vectors: np.ndarray, route: AttentionFn
) -> None:
    # The "eager" backend runs dynamo's capture (graph breaks at attention) without codegen.
    np.testing.assert_allclose(_embed(qwen3_dir, route, backend="eager"), plain_vectors, atol=2e-5)


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
@pytest.mark.parametrize("route", [lower_right_attention], indirect=True, ids=["lr"])
def test_inductor_buckets_give_the_same_vectors(
    qwen3_dir: Path, plain_vectors: np.ndarray, route: AttentionFn
) -> None:
    # inductor generates its own matmuls: the weights must stay plain tensors, not oneDNN's
    # opaque packed ones (every request failed with prepacked weights)
    np.testing.assert_allclose(_embed(qwen3_dir, route, backend="inductor"), plain_vectors, atol=2e-5)


def test_the_engine_option_builds_a_bucketed_runner_that_checks_buckets(qwen3_dir: Path) -> None:
    runner = build_engine(qwen3_dir, max_num_batched_tokens=64, kv_cache_memory=1 << 20, token_buckets=True)
    bucketed = runner.core.runner
    assert isinstance(bucketed, BucketedModelRunner) and bucketed.buckets == token_buckets(64)
    for bad in [(), (64, 16), (16, 16)]:
        with pytest.raises(ValueError, match="ascending"):
            BucketedModelRunner(bucketed.model, 4, 16, torch.float32, torch.device("cpu"), bad)
