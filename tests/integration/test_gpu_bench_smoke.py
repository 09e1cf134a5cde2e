"""benchmarks/gpu/bench.py --cpu-smoke: the whole GPU benchmark flow, on CPU with tiny shapes.

Runs it as the device would (a separate process, `python benchmarks/gpu/bench.py`), with
the CUDA attention route and token buckets the GPU run can use, and checks the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_run_records_parity_and_both_backends(tmp_path: Path) -> None:
    cmd = [sys.executable, "benchmarks/gpu/bench.py", "--cpu-smoke", "--attention", "sdpa-lower-right",
           "--buckets", "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SUMMARY" in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith("JSON:")
    record = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert record["errors"] == [] and record["skipped"] == []
    assert record["meta"]["attention"] == "sdpa-lower-right"
    assert record["meta"]["attention_calls"] > 0  # the engine really ran the installed route
    assert [p["shape"] for p in record["parity"]] == ["tiny-qwen3", "tiny-qwen3-b"]
    for p in record["parity"]:
        assert p["passed"] and set(p["cosine"]) == {"64", "256", "1024"}
    rows = {(r["shape"], r["length"], r["backend"]): r for r in record["throughput"]}
    assert len(rows) == 2 * 2 * 2  # shapes x lengths x backends
    for (_, _, backend), r in rows.items():
        assert r["completed"] > 0 and r["tok_s"] > 0 and r["p95_s"] >= r["p50_s"]
        if backend == "transformers-sdpa":
            assert r["cosine_vs_engine"] > 0.999  # same weights and inputs on both backends
    assert (tmp_path / "summary.txt").read_text().startswith("\n====")
