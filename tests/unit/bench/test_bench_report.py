"""report.md ratios: each row against the first target's row of the same cell."""

from __future__ import annotations

from typing import Any

from embedserve.bench.markdown import render


def _row(target: str, budget: Any, tok_s: float, mem: int) -> dict[str, Any]:
    return {
        "scenario": "matrix", "target": target, "length": "512", "length_bucket": "0-1K",
        "concurrency": 8, "token_budget": budget, "requests": 4, "req_per_s": 1.0, "tok_per_s": tok_s,
        "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "queue_p50_ms": None, "peak_mem_bytes": mem,
        "errors": 0, "oom": 0, "cosine_min": None,
    }  # fmt: skip


META = {
    "scenario": "matrix",
    "command": "embedserve bench ...",
    "machine": {
        "cpu_model": "cpu", "cores": 2, "physical_cores": 2, "memory_bytes": 2**30,
        "torch_version": "x", "torch_threads": 2, "gpu": None, "date": "now", "load_avg_1m": 0.5,
    },
    "groups": [],
}  # fmt: skip


def _ratios(report: str, target: str, budget: str) -> tuple[str, str]:
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == target and cells[3] == budget:
            return cells[-4], cells[-2]
    raise AssertionError(f"no row for {target} budget {budget}")


def test_ratios_use_the_same_budget_else_the_first_targets_best() -> None:
    rows = [
        _row("engine", 512, 100.0, 1000),
        _row("engine", 2048, 200.0, 2000),
        _row("engine-bf16", 2048, 300.0, 1000),
        _row("st", "n/a", 50.0, 4000),
    ]
    report = render(META, rows, [])
    assert _ratios(report, "engine", "2048") == ("1.00x", "1.00x")
    assert _ratios(report, "engine-bf16", "2048") == ("1.50x", "0.50x")  # same budget: engine@2048
    assert _ratios(report, "st", "n/a") == ("0.25x", "2.00x")  # no budget: engine's best (2048)


def test_added_memory_column_and_its_ratio() -> None:
    rows = [_row("st", "n/a", 50.0, 4000) | {"added_mem_bytes": 2 << 20}]
    rows.append(_row("engine", 2048, 100.0, 3000) | {"added_mem_bytes": 1 << 20})
    rows.append(_row("other", 2048, 100.0, 3000))  # no start measure: no added memory
    lines = render(META, rows, []).splitlines()
    header = next(line for line in lines if line.startswith("| target | length"))
    assert header.rstrip(" |").endswith("mem vs first | added vs first")
    cells = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines)}
    added = header.strip("|").split("|").index(" added MB ")
    assert (cells["st"][added], cells["engine"][added], cells["other"][added]) == ("2", "1", "-")
    assert (cells["engine"][-1], cells["other"][-1]) == ("0.50x", "-")


def test_first_target_without_budget_is_the_reference_for_every_budget() -> None:
    rows = [_row("st", "n/a", 50.0, 4000), _row("engine", 512, 100.0, 1000), _row("engine", 2048, 25.0, 1000)]
    report = render(META, rows, [])
    assert _ratios(report, "engine", "512") == ("2.00x", "0.25x")
    assert _ratios(report, "engine", "2048") == ("0.50x", "0.25x")
    assert "### Bucket 0-1K" in report and "load average 0.5" in report
