"""`embedserve parity` as a real process on a tiny model: pass (0), gate failure (1), cannot run (2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.cli import main
from embedserve.parity.runner import Outcome, Settings, run
from tests.helpers.openai_stub import StubState, serve_stub

SMALL_PASSKEY = "passkey?lengths=128,1500&per_length=2"
DATASETS = "passkey?lengths=128,1500&per_length=2,random-tokens?lengths=32,700&per_length=1"


def _parity(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "embedserve", "parity", "--out", str(out), "--no-progress", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_engine_fp32_passes_against_hf_fp32(qwen3_dir: Path, tmp_path: Path) -> None:
    proc = _parity(
        tmp_path,
        "--reference", f"hf:{qwen3_dir}",
        # a small token budget: the 1.5K-token documents are embedded in chunks
        "--candidate", f"engine:{qwen3_dir}?max_num_batched_tokens=256",
        "--dataset", DATASETS,
        "--scenario", "preemption", "--scenario-length", "1024",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] and all(c["passed"] for c in report["checks"])
    passkey = report["datasets"]["passkey"]
    assert set(passkey["buckets"]) == {"0-1K", "1K-4K", "overall"}
    assert passkey["buckets"]["overall"]["vector_cosine"]["min"] >= 0.99999
    assert passkey["info"]["bm25_acc@1"] == 1.0
    scenario = report["scenarios"]["preemption"]
    assert scenario["preemptions"] > 0 and scenario["min_cosine"] >= 0.999
    for side in ("reference", "candidate"):
        for key in ("model", "model_version", "dtype", "backend_profile", "embedding_schema", "config"):
            assert report[side][key], (side, key)
    assert report["candidate"]["config"]["scheduler"]["max_num_batched_tokens"] == 256
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith("## embedserve parity: PASS") and "| **overall** |" in markdown
    assert "scenario: preemption" in markdown and "FAIL" not in markdown


@pytest.mark.slow  # CI time (2026-12-07): its area keeps a representative in CI
def test_mean_pooling_candidate_fails_naming_the_metric(qwen3_dir: Path, tmp_path: Path) -> None:
    proc = _parity(
        tmp_path,
        "--reference", f"hf:{qwen3_dir}",
        "--candidate", f"engine:{qwen3_dir}?pooling=mean",  # the model pools its last token
        "--dataset", "passkey?lengths=128,600&per_length=2",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "GATE FAILED" in proc.stderr and "passkey/overall: vector_cosine.p50" in proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["passed"]
    assert "❌ FAIL" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("candidate", "dataset", "message"),
    [
        ("engine:{m}?poling=mean", "passkey", "unknown option(s) poling"),
        ("engine:{m}", "pasky", "unknown dataset 'pasky'"),
        ("engine:/no/such/model", "passkey", "/no/such/model"),
        ("tensorrt:{m}", "passkey", "unknown kind 'tensorrt'"),
    ],
)
def test_could_not_run_exits_2(qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               candidate: str, dataset: str, message: str) -> None:  # fmt: skip
    args = ["parity", "--reference", f"hf:{qwen3_dir}", "--candidate", candidate.format(m=qwen3_dir)]
    rc = main([*args, "--dataset", dataset, "--out", str(tmp_path), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "could not run" in err and message in err


def _run_http(model_dir: Path, candidate: str) -> Outcome:
    """hf reference vs an http candidate on a small passkey set; the gate must pass."""
    outcome = run(Settings(f"hf:{model_dir}", candidate, [SMALL_PASSKEY], progress=False))
    assert outcome.passed, [c.describe() for c in outcome.checks if not c.passed]
    return outcome


def test_http_candidate_against_an_openai_compatible_server(qwen3_dir: Path) -> None:
    """An engine behind a minimal OpenAI-compatible endpoint: prompts travel inside the text."""
    with Engine.from_pretrained(qwen3_dir) as engine:

        def embed(inputs: list[object]) -> list[list[float]]:
            vectors = engine.embed(inputs, truncate="end")  # type: ignore[arg-type]
            return np.asarray(vectors).tolist()

        state = StubState(embed, metadata={"model_version": "stub-1", "backend_profile": "stub"})
        with serve_stub(state) as url:
            outcome = _run_http(qwen3_dir, f"{url}?model=stub-model&tokenizer={qwen3_dir}")
    assert outcome.report["candidate"]["model_version"] == "stub-1"
    queries = [r["input"] for r in state.requests if r["input"][0].startswith("Instruct:")]
    assert queries and all("\nQuery:What is the pass key" in q for batch in queries for q in batch)


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_http_candidate_audits_embedserve_serve(qwen3_dir: Path, tmp_path: Path) -> None:
    """The real server (`embedserve serve`) as an http candidate, with an API key."""
    pytest.importorskip("embedserve.server")
    server_process = pytest.importorskip("tests.helpers.server_process")
    args = ("--served-model-name", "tiny", "--warmup-lengths", "16")
    server = server_process.start_server(qwen3_dir, tmp_path, *args, env={"EMBEDSERVE_API_KEY": "k"})
    try:
        server.wait_ready()
        outcome = _run_http(qwen3_dir, f"{server.base_url}?api_key=k&tokenizer={qwen3_dir}")
    finally:
        server.terminate()
    candidate = outcome.report["candidate"]
    assert candidate["model"] == "tiny" and candidate["embedding_schema"] and candidate["model_version"]
    assert "k&" not in candidate["spec"]
