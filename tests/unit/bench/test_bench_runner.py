"""The matrix runner end to end on a tiny model: every output is written, failures are recorded.

Each (target, token budget) group runs in its own worker process, as in real runs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from embedserve.bench.report import COLUMNS
from embedserve.bench.runner import Cell, CellResult, Group, _record_failure
from embedserve.bench.target import parse_target
from embedserve.cli import main


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # CI time: the failing-cells run covers the runner in CI
def test_matrix_2x2_writes_every_output(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main([
        "bench", "--target", f"sentence-transformers:{qwen3_dir}?name=st",
        "--target", f"engine:{qwen3_dir}?name=engine",
        "--lengths", "24,300", "--concurrency", "1,3", "--token-budget", "128",
        "--requests", "3", "--out", str(out), "--no-progress",
    ])  # fmt: skip
    assert code == 0
    rows = _rows(out)
    assert list(rows[0]) == COLUMNS
    cells = {(r["target"], r["length"], r["concurrency"], r["token_budget"]) for r in rows}
    assert cells == {
        (t, n, c, b) for t, b in (("st", "n/a"), ("engine", "128")) for n in ("24", "300") for c in ("1", "3")
    }
    for r in rows:
        assert (r["length_bucket"], r["requests"], r["errors"], r["oom"]) == ("0-1K", "3", "0", "0")
        assert float(r["tok_per_s"]) > 0 and float(r["p50_ms"]) <= float(r["p95_ms"]) <= float(r["p99_ms"])
        assert int(r["peak_mem_bytes"]) > 50 << 20  # a process with torch loaded
        assert 0 <= int(r["added_mem_bytes"]) < int(r["peak_mem_bytes"])  # the cell's own share
        assert float(r["cpu_s"]) > 0 and float(r["tok_per_cpu_s"]) > 0
        # same inputs, same fp32 numerics: the engine's vectors equal the baseline's
        assert float(r["cosine_min"]) > 0.9999
        assert (r["cpu_model"], r["torch_version"], r["device"]) != ("", "", "")
    data = json.loads((out / "results.json").read_text())
    assert data["machine"]["cores"] >= 1 and len(data["rows"]) == len(rows)
    report = (out / "report.md").read_text()
    assert "### Bucket 0-1K" in report and "tok/s vs st" in report and "1.00x" in report
    for png in ("tok_s_vs_budget.png", "p95_vs_concurrency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_failing_cells_and_targets_are_recorded_and_the_run_goes_on(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main([
        "bench", "--target", f"engine:{qwen3_dir}?max_model_len=64&name=short-engine",
        "--target", f"engine:{qwen3_dir}?kv_cache_memory=1&name=broken",
        "--target", f"hf:{qwen3_dir}?name=hf",
        "--lengths", "40,100", "--concurrency", "2", "--token-budget", "64",
        "--requests", "2", "--out", str(out), "--no-progress", "--cosine-sample", "0",
    ])  # fmt: skip
    assert code == 0
    rows = {(r["target"], r["length"]): r for r in _rows(out)}
    ok, too_long = rows["short-engine", "40"], rows["short-engine", "100"]
    assert (ok["errors"], ok["error"]) == ("0", "") and float(ok["tok_per_s"]) > 0
    assert too_long["errors"] == "2" and "exceed the limit of 64" in too_long["error"]
    assert (float(too_long["tok_per_s"]), too_long["p50_ms"]) == (0.0, "")  # nothing succeeded
    for length in ("40", "100"):  # the engine that cannot even load: every cell says why
        broken = rows["broken", length]
        assert broken["errors"] == "2" and "ModelLoadError" in broken["error"]
    assert "ModelLoadError" in (out / "report.md").read_text()
    for length in ("40", "100"):  # a target after the broken one still ran (no length limit there)
        assert rows["hf", length]["errors"] == "0" and float(rows["hf", length]["tok_per_s"]) > 0


def test_a_worker_killed_mid_run_marks_its_remaining_cells(tmp_path: Path) -> None:
    group = Group(0, parse_target(f"hf:{tmp_path}"), None, [Cell(0, "64", 1, 4), Cell(1, "64", 8, 4)])
    group.results[0] = CellResult(wall_s=1.0)
    _record_failure(group, -9, timed_out=False, tail="", timeout=60)
    assert group.results[0].error is None  # reported before the kill: kept
    assert group.results[1].oom and "code -9" in str(group.results[1].error)
    stalled = Group(0, parse_target(f"hf:{tmp_path}"), None, [Cell(0, "64", 1, 4)])
    _record_failure(stalled, -9, timed_out=True, tail="", timeout=60)
    assert not stalled.results[0].oom and "no progress for 60 s" in str(stalled.results[0].error)


@pytest.mark.parametrize("bad", [["--requests", "0"], ["--concurrency", "0"], ["--mix", "9K:1"]])
def test_bad_options_are_refused_before_running(qwen3_dir: Path, tmp_path: Path, bad: list[str]) -> None:
    argv = ["bench", "--target", f"engine:{qwen3_dir}", "--lengths", "16", "--out", str(tmp_path)]
    assert main([*argv, *bad]) == 2
    assert not (tmp_path / "results.csv").exists()


def test_each_target_waits_for_the_served_targets_to_go_quiet(
    qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedserve.bench import runner

    events: list[tuple[str, object]] = []

    def fake_group(cfg: object, group: Group, *args: object) -> None:
        events.append(("group", group.spec.name))
        _record_failure(group, 1, timed_out=False, tail="not run in this test", timeout=60)

    monkeypatch.setattr(runner, "run_group", fake_group)
    monkeypatch.setattr(runner, "wait_quiet", lambda pids, most_s: events.append(("quiet", tuple(pids))))
    code = main([
        "bench", "--target", "http://127.0.0.1:9/v1?model=m&pid=4242&name=peer",
        "--target", "http://127.0.0.1:9/v1?model=m&name=nopid",
        "--lengths", "40", "--concurrency", "1", "--requests", "1", "--text", "random",
        "--tokenizer", str(qwen3_dir), "--out", str(tmp_path / "bench"), "--no-progress",
        "--cosine-sample", "0",
    ])  # fmt: skip
    assert code == 0
    # before every target, the served targets that gave a pid (only those can be watched)
    assert events == [("quiet", (4242,)), ("group", "peer"), ("quiet", (4242,)), ("group", "nopid")]
