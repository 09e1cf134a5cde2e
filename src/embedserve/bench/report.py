"""Turn collected groups into rows and write results.csv / results.json (+ report.md, plots).

One row per cell and length bucket. A mixed-length cell gives one row per bucket it drew plus
an "all" row; a cell that never ran gives one row carrying the reason in `error`.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.bench.config import BenchConfig
from embedserve.bench.inputs import MIX, Workload
from embedserve.bench.interference import DOCS, FLOOD, IDLE, interference_stats
from embedserve.bench.runner import Cell, CellResult, Group
from embedserve.bench.stats import ALL, BucketStats, per_bucket, samples_from_json
from embedserve.lengths import bucket_of

NA = "n/a"
COLUMNS = [
    "scenario",
    "target",
    "length",
    "length_bucket",
    "concurrency",
    "token_budget",
    "requests",
    "req_per_s",
    "tok_per_s",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "queue_p50_ms",
    "peak_mem_bytes",
    "added_mem_bytes",
    "cpu_s",
    "tok_per_cpu_s",
    "errors",
    "oom",
    "cosine_min",
    "preemptions",
    "error",
    "device",
    "mem_method",
    "cpu_model",
    "cores",
    "torch_version",
]


def _added(res: CellResult) -> int | None:
    """Peak memory over the cell minus the memory at its start: what the cell's work added."""
    if res.peak_mem is None or res.start_mem is None:
        return None
    return max(0, res.peak_mem - res.start_mem)


def _cos(a: list[float] | None, b: list[float] | None) -> float | None:
    if a is None or b is None or len(a) != len(b):
        return None
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y / denom) if denom > 0 else None


def cosine_min(group: Group, ref: Group, workload: Workload, bucket: str) -> float | None:
    """Lowest cosine to the reference target over the sampled texts of this bucket."""
    mine, theirs = group.vectors.get(workload.key, []), ref.vectors.get(workload.key, [])
    values = [
        c
        for i, (a, b) in enumerate(zip(mine, theirs, strict=False))
        if bucket == ALL or bucket_of(workload.tokens[i]) == bucket
        if (c := _cos(a, b)) is not None
    ]
    return min(values) if values else None


def _base(g: Group, machine: dict[str, Any]) -> dict[str, Any]:
    return {
        "target": g.spec.name,
        "token_budget": g.token_budget if g.token_budget is not None else NA,
        "device": g.device or NA,
        "mem_method": g.mem_method,
        "cpu_model": machine["cpu_model"],
        "cores": machine["cores"],
        "torch_version": machine["torch_version"],
    }


def _stats_row(b: BucketStats) -> dict[str, Any]:
    return {k: v for k, v in b.__dict__.items() if k != "bucket"} | {"length_bucket": b.bucket}


def _per_cpu(b: BucketStats, res: CellResult) -> float | None:
    return b.tok_per_s * res.wall_s / res.cpu_s if res.cpu_s else None


def _cell_rows(
    g: Group, ref: Group, cell: Cell, res: CellResult, inputs: dict[str, Workload]
) -> list[dict[str, Any]]:
    w = inputs[cell.workload]
    common = {"scenario": "matrix", "length": cell.workload, "concurrency": cell.concurrency}
    if res.error is not None:
        bucket = ALL if cell.workload == MIX else bucket_of(int(cell.workload))
        failed = {"errors": 0 if res.oom else cell.requests, "oom": cell.requests if res.oom else 0}
        return [common | {"length_bucket": bucket, "requests": cell.requests, "error": res.error} | failed]
    rows = []
    buckets = per_bucket(res.samples, res.wall_s, with_all=cell.workload == MIX)
    for b in buckets:
        first_error = next(
            (
                s.error
                for s in res.samples
                if s.error and (b.bucket == ALL or bucket_of(s.num_tokens) == b.bucket)
            ),
            None,
        )
        rows.append(
            common
            | _stats_row(b)
            | {
                "peak_mem_bytes": res.peak_mem,
                "added_mem_bytes": _added(res),
                "cpu_s": res.cpu_s,
                # CPU time is only known for the whole cell: per-bucket rows of a mix get none
                "tok_per_cpu_s": _per_cpu(b, res) if b.bucket == ALL or len(buckets) == 1 else None,
                "cosine_min": cosine_min(g, ref, w, b.bucket),
                "preemptions": res.counters.get("preemptions"),
                "error": first_error,
            }
        )
    return rows


def _interference_rows(g: Group, cfg: BenchConfig) -> list[dict[str, Any]]:
    common = {"concurrency": cfg.flood_clients}
    lengths = {
        IDLE: str(cfg.short_tokens),
        FLOOD: str(cfg.short_tokens),
        DOCS: f"{cfg.flood_min}-{cfg.flood_max}",
    }
    if g.interference is None:
        bucket = bucket_of(cfg.short_tokens)
        return [
            common
            | {
                "scenario": s,
                "length": lengths[s],
                "length_bucket": bucket,
                "requests": cfg.short_requests,
                "errors": cfg.short_requests,
                "error": g.error,
            }
            for s in (IDLE, FLOOD)
        ]
    i = g.interference
    stats = interference_stats(
        samples_from_json(i["idle"]),
        samples_from_json(i["flood"]),
        samples_from_json(i["docs"]),
        i["idle_wall_s"],
        i["flood_wall_s"],
        cfg.flood_min,
    )
    peaks = {IDLE: i["idle_peak"], FLOOD: i["flood_peak"], DOCS: i["flood_peak"]}
    return [
        common | {"scenario": s, "length": lengths[s], "peak_mem_bytes": peaks[s]} | _stats_row(b)
        for s, b in stats
    ]


def build_rows(
    cfg: BenchConfig, groups: list[Group], inputs: dict[str, Workload], machine: dict[str, Any]
) -> list[dict[str, Any]]:
    rows = []
    for g in groups:
        base = _base(g, machine)
        if cfg.scenario == "interference":
            rows += [base | r for r in _interference_rows(g, cfg)]
            continue
        for cell in g.cells:
            rows += [base | r for r in _cell_rows(g, groups[0], cell, g.results[cell.id], inputs)]
    return [{c: r.get(c) for c in COLUMNS} for r in rows]


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 4)
    return v


def write_results(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if (v := _clean(x)) is None else v for k, x in r.items()})
    clean = [{k: _clean(v) for k, v in r.items()} for r in rows]
    (out / "results.json").write_text(json.dumps(meta | {"rows": clean}, indent=1) + "\n", encoding="utf-8")


def group_meta(groups: list[Group]) -> list[dict[str, Any]]:
    return [
        {
            "target": g.spec.name,
            "spec": g.spec.shown,  # an http target's api_key is never written
            "token_budget": g.token_budget,
            "device": g.device,
            "mem_method": g.mem_method,
            "threads": g.threads,
            "load_s": g.load_s,
            "error": g.error,
        }
        for g in groups
    ]


def interference_latencies(groups: list[Group]) -> list[dict[str, Any]]:
    """Every short query's latency (ms), idle and under flood, for the CDF plot."""
    out = []
    for g in groups:
        if g.interference is None:
            continue
        for scenario, key in ((IDLE, "idle"), (FLOOD, "flood")):
            ok = [s.latency * 1000 for s in samples_from_json(g.interference[key]) if s.error is None]
            out.append(
                {
                    "target": g.spec.name,
                    "token_budget": g.token_budget,
                    "scenario": scenario,
                    "latencies_ms": [round(x, 3) for x in sorted(ok)],
                }
            )
    return out
