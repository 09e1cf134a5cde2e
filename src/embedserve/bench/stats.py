"""Percentiles and the per-bucket statistics of one cell.

Short and long requests are never averaged together: every statistic below is computed per
length bucket (`embedserve.lengths`) plus an "all" row for mixed cells.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embedserve.lengths import BUCKET_NAMES, bucket_of

ALL = "all"


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between order statistics.

    Same definition as numpy's default: rank = q/100 * (n-1). NaN for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return math.nan
    xs = sorted(values)
    rank = q / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True)
class Sample:
    """One request's outcome. Latency is end-to-end as the client saw it."""

    num_tokens: int
    latency: float  # seconds
    queue: float | None  # seconds waiting before first compute, when the target reports it
    error: str | None = None
    oom: bool = False


@dataclass(frozen=True)
class BucketStats:
    bucket: str
    requests: int
    req_per_s: float
    tok_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    queue_p50_ms: float
    errors: int
    oom: int


def bucket_stats(bucket: str, samples: Sequence[Sample], wall_s: float) -> BucketStats:
    """Throughput counts only successful requests over the whole cell's wall time."""
    ok = [s for s in samples if s.error is None]
    lat_ms = [s.latency * 1000 for s in ok]
    queue_ms = [s.queue * 1000 for s in ok if s.queue is not None]
    return BucketStats(
        bucket=bucket,
        requests=len(samples),
        req_per_s=_rate(len(ok), wall_s),
        tok_per_s=_rate(sum(s.num_tokens for s in ok), wall_s),
        p50_ms=percentile(lat_ms, 50),
        p95_ms=percentile(lat_ms, 95),
        p99_ms=percentile(lat_ms, 99),
        queue_p50_ms=percentile(queue_ms, 50),
        errors=sum(1 for s in samples if s.error is not None and not s.oom),
        oom=sum(1 for s in samples if s.oom),
    )


def _rate(count: int, wall_s: float) -> float:
    return count / wall_s if wall_s > 0 else math.nan


def per_bucket(samples: Sequence[Sample], wall_s: float, with_all: bool) -> list[BucketStats]:
    """Stats for each bucket that has requests, in bucket order; "all" last when asked."""
    rows = []
    for name in BUCKET_NAMES:
        mine = [s for s in samples if bucket_of(s.num_tokens) == name]
        if mine:
            rows.append(bucket_stats(name, mine, wall_s))
    if with_all:
        rows.append(bucket_stats(ALL, samples, wall_s))
    return rows


def samples_json(samples: Sequence[Sample]) -> list[list[Any]]:
    """Compact rows for the worker -> parent pipe."""
    return [[s.num_tokens, s.latency, s.queue, s.error, s.oom] for s in samples]


def samples_from_json(rows: list[list[Any]]) -> list[Sample]:
    return [Sample(int(n), float(lat), q, err, bool(oom)) for n, lat, q, err, oom in rows]
