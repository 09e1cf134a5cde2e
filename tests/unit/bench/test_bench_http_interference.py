"""The http:// target against a minimal OpenAI-compatible server, and the interference scenario."""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedserve.cli import main
from tests.helpers.openai_stub import StubState, serve_stub


def _embed_with_cpu_work(texts: list[str]) -> list[list[float]]:
    """Vectors that depend on the text, after 5 ms of real CPU work (so the pid's CPU time shows)."""
    spent = time.process_time()
    while time.process_time() - spent < 0.005:
        pass
    return [[float(len(t) % 7 + 1), 1.0, float(t.count(" ") % 5)] for t in texts]


@pytest.fixture
def fake_state() -> StubState:
    return StubState(_embed_with_cpu_work, model="fake-model", headers={"x-queue-time": "1.5"})


@pytest.fixture
def fake_server(fake_state: StubState) -> Iterator[str]:
    with serve_stub(fake_state) as url:
        yield f"{url}/v1"


def test_http_target_runs_the_matrix(
    fake_server: str, fake_state: StubState, qwen3_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    target = f"{fake_server}?name=served&pid={os.getpid()}"
    argv = ["bench", "--target", target, "--tokenizer", str(qwen3_dir), "--lengths", "20", "--mix",
            "0-1K:1,1K-4K:1", "--max-tokens", "2000", "--concurrency", "4", "--requests", "6",
            "--token-budget", "256,512", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    # The budget axis does not apply to a served target: it ran once per cell, budget n/a.
    assert {r["token_budget"] for r in rows} == {"n/a"}
    fixed = [r for r in rows if r["length"] == "20"]
    assert len(fixed) == 1 and fixed[0]["requests"] == "6" and fixed[0]["errors"] == "0"
    assert float(fixed[0]["queue_p50_ms"]) == pytest.approx(1.5)  # from the x-queue-time header
    assert int(fixed[0]["peak_mem_bytes"]) > 0  # the server's RSS, sampled through pid=
    assert float(fixed[0]["cpu_s"]) >= 0.01  # and its CPU time: 6 requests x 5 ms of work
    mixed_cpu = [r["tok_per_cpu_s"] for r in rows if r["length"] == "mix"]
    assert mixed_cpu[:-1] == ["", ""] and float(mixed_cpu[-1]) > 0  # whole-cell rows only
    mixed = [r for r in rows if r["length"] == "mix"]
    assert [r["length_bucket"] for r in mixed][-1] == "all"
    assert sum(int(r["requests"]) for r in mixed[:-1]) == int(mixed[-1]["requests"]) == 6
    # 3 warm-ups + cosine sample + 12 matrix requests; model name discovered from /v1/models; no priority
    assert len(fake_state.requests) == 3 + 2 + 12
    assert all(b["model"] == "fake-model" and "priority" not in b for b in fake_state.requests)


@pytest.mark.slow  # CI time: the http target's matrix runs in CI
def test_interference_reports_short_queries_idle_and_flooded(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "--scenario", "interference", "--target", f"sentence-transformers:{qwen3_dir}?name=st",
            "--target", f"engine:{qwen3_dir}?name=engine", "--token-budget", "256",
            "--short-tokens", "16", "--short-requests", "6", "--short-interval-ms", "20",
            "--flood-min", "1500", "--flood-max", "3000", "--flood-clients", "2", "--settle-s", "0.2",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    by = {(r["target"], r["scenario"]): r for r in rows}
    for target in ("st", "engine"):
        idle, flood = by[target, "interference-idle"], by[target, "interference-flood"]
        assert (idle["requests"], flood["requests"], idle["errors"], flood["errors"]) == ("6", "6", "0", "0")
        assert idle["length_bucket"] == "0-1K" and flood["concurrency"] == "2"
        assert by[target, "interference-docs"]["length_bucket"] == "1K-4K"  # present even if 0 finished
    assert sum(int(by[t, "interference-docs"]["requests"]) for t in ("st", "engine")) >= 1
    data = json.loads((out / "results.json").read_text())
    assert len(data["latencies"]) == 4 and all(len(e["latencies_ms"]) == 6 for e in data["latencies"])
    assert "Interference" in (out / "report.md").read_text()
    assert (out / "interference_cdf.png").read_bytes()[:4] == b"\x89PNG"
