"""`--scenario interference`: short online queries while long batch documents flood the target.

Worker side: the same steady stream of short queries (open loop, one every `interval_s`) runs
twice, first on the idle target, then while `flood_clients` closed-loop clients keep sending
8K-16K-token documents at batch priority. The short queries' p50/p95 under flood vs idle is
the head-of-line blocking a long-document index job causes. Parent side: rows for the report.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from embedserve.bench.load import Flood, open_loop
from embedserve.bench.memory import PeakMemory
from embedserve.bench.stats import BucketStats, Sample, bucket_stats, per_bucket, samples_json
from embedserve.bench.target import Session
from embedserve.lengths import bucket_of

IDLE, FLOOD, DOCS = "interference-idle", "interference-flood", "interference-docs"


async def run_interference(
    session: Session, inputs: dict[str, Any], cfg: dict[str, Any], pid: int | None
) -> dict[str, Any]:
    short, docs = inputs[cfg["short_key"]], inputs[cfg["flood_key"]]
    interval = cfg["interval_s"]
    with PeakMemory(session.device, pid) as idle_mem:
        t0 = time.perf_counter()
        idle = await open_loop(session, short["texts"], short["tokens"], interval, "online")
        idle_wall = time.perf_counter() - t0
    with PeakMemory(session.device, pid) as flood_mem:
        t0 = time.perf_counter()
        flood = Flood(session, docs["texts"], docs["tokens"], cfg["flood_clients"])
        # Let the documents reach the target (and its batcher) before the first query.
        await asyncio.sleep(cfg["settle_s"])
        flooded = await open_loop(session, short["texts"], short["tokens"], interval, "online")
        await flood.stop()
        flood_wall = time.perf_counter() - t0
    return {
        "idle": samples_json(idle),
        "flood": samples_json(flooded),
        "docs": samples_json(flood.samples),
        "idle_wall_s": idle_wall,
        "flood_wall_s": flood_wall,
        "idle_peak": idle_mem.peak,
        "flood_peak": flood_mem.peak,
    }


def interference_stats(
    idle: list[Sample],
    flood: list[Sample],
    docs: list[Sample],
    idle_wall: float,
    flood_wall: float,
    flood_min: int,
) -> list[tuple[str, BucketStats]]:
    """(scenario, stats) rows: the short stream idle and under flood, then the documents.

    A target that finished no document during the flood still gets a documents row (0 requests):
    that is a result, not a gap."""
    parts = ((IDLE, idle, idle_wall), (FLOOD, flood, flood_wall), (DOCS, docs, flood_wall))
    rows = [(name, b) for name, samples, wall in parts for b in per_bucket(samples, wall, with_all=False)]
    if not docs:
        rows.append((DOCS, bucket_stats(bucket_of(flood_min), [], flood_wall)))
    return rows
