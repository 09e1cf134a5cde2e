"""Bucket assignment, percentile maths and per-bucket statistics of the bench tool."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embedserve.bench.interference import DOCS, FLOOD, IDLE, interference_stats
from embedserve.bench.stats import (
    ALL,
    Sample,
    bucket_stats,
    per_bucket,
    percentile,
    samples_from_json,
    samples_json,
)
from embedserve.errors import InvalidInputError
from embedserve.lengths import bucket_of, bucket_range


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [
        (1, "0-1K"),
        (1024, "0-1K"),
        (1025, "1K-4K"),
        (4096, "1K-4K"),
        (4097, "4K-8K"),
        (8192, "4K-8K"),
        (8193, "8K-16K"),
        (16384, "8K-16K"),
        (16385, "16K+"),
    ],
)
def test_bucket_boundaries_are_inclusive_on_the_upper_end(tokens: int, bucket: str) -> None:
    assert bucket_of(tokens) == bucket
    lo, hi = bucket_range(bucket)
    assert lo < tokens <= hi


def test_bucket_rejects_empty_requests_and_unknown_names() -> None:
    with pytest.raises(InvalidInputError, match="at least one token"):
        bucket_of(0)
    with pytest.raises(InvalidInputError, match="0-1K"):
        bucket_range("2K-3K")


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_percentile_matches_numpy_linear_interpolation(n: int) -> None:
    values = list(np.random.default_rng(n).exponential(10.0, size=n))
    for q in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_percentile_hand_values_and_edges() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # order does not matter
    assert percentile([10.0, 20.0], 95) == pytest.approx(19.5)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)


def test_bucket_stats_counts_only_successes_in_throughput() -> None:
    samples = [
        Sample(100, 0.010, 0.001),
        Sample(300, 0.030, 0.003),
        Sample(200, 0.050, None, error="InternalEngineError: boom"),
        Sample(200, 0.060, None, error="OutOfMemoryError: CUDA out of memory", oom=True),
    ]
    s = bucket_stats("0-1K", samples, wall_s=2.0)
    assert s.requests == 4
    assert s.req_per_s == pytest.approx(1.0)  # 2 successes / 2 s
    assert s.tok_per_s == pytest.approx(200.0)  # 400 tokens / 2 s
    assert s.p50_ms == pytest.approx(20.0)
    assert s.queue_p50_ms == pytest.approx(2.0)
    assert (s.errors, s.oom) == (1, 1)


def test_per_bucket_splits_mixed_cells_and_adds_all() -> None:
    samples = [Sample(500, 0.01, None), Sample(3000, 0.1, None), Sample(600, 0.02, None)]
    rows = per_bucket(samples, wall_s=1.0, with_all=True)
    assert [(r.bucket, r.requests) for r in rows] == [("0-1K", 2), ("1K-4K", 1), (ALL, 3)]
    assert rows[0].tok_per_s == pytest.approx(1100.0)
    assert rows[-1].tok_per_s == pytest.approx(4100.0)
    assert [r.bucket for r in per_bucket(samples, 1.0, with_all=False)] == ["0-1K", "1K-4K"]


def test_samples_survive_the_worker_pipe() -> None:
    samples = [Sample(5, 0.5, None, "x", True), Sample(7, 0.25, 0.125)]
    assert samples_from_json(samples_json(samples)) == samples


def test_interference_rows_keep_a_documents_row_when_none_finished() -> None:
    short = [Sample(32, 0.01, None), Sample(32, 0.02, None)]
    rows = interference_stats(short, short, [], idle_wall=1.0, flood_wall=2.0, flood_min=8192)
    assert [(name, b.bucket, b.requests) for name, b in rows] == [
        (IDLE, "0-1K", 2),
        (FLOOD, "0-1K", 2),
        (DOCS, "4K-8K", 0),
    ]
    assert rows[-1][1].tok_per_s == 0.0
