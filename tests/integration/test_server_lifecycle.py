"""Process lifecycle: graceful SIGTERM under load, and a model that cannot load."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.helpers.server_process import free_port, start_server, words


def test_sigterm_under_load_finishes_in_flight_requests_then_exits_0(qwen3_dir: Path, tmp_path: Path) -> None:
    server = start_server(qwen3_dir, tmp_path, "--max-model-len", "8192", "--warmup-lengths", "16")
    try:
        server.wait_ready()
        texts = [words(6000, seed) for seed in range(6)]
        results: dict[int, httpx.Response | BaseException] = {}

        def call(k: int) -> None:
            try:
                results[k] = httpx.post(
                    server.base_url + "/v1/embeddings", json={"input": texts[k]}, timeout=120
                )
            except BaseException as e:
                results[k] = e

        threads = [threading.Thread(target=call, args=(k,)) for k in range(len(texts))]
        for t in threads:
            t.start()
        _wait_admitted(server.base_url, len(texts))
        server.proc.send_signal(signal.SIGTERM)
        _wait_refusing(server.base_url)
        for t in threads:
            t.join(120)
        rc = server.proc.wait(60)
    finally:
        server.terminate()
    for k in range(len(texts)):
        r = results[k]
        assert isinstance(r, httpx.Response) and r.status_code == 200, (r, server.log())
        assert len(r.json()["data"][0]["embedding"]) == 64
    assert rc == 0, server.log()
    assert "shutdown complete" in server.log()


def _wait_admitted(base_url: str, n: int, timeout: float = 30.0) -> None:
    """Until the server holds all n requests (so SIGTERM really lands during the load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(base_url + "/metrics").text
        line = next((ln for ln in text.splitlines() if ln.startswith("embedserve_admitted_inputs ")), "")
        if line and float(line.split()[1]) >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"the server never held {n} requests at once")


def _wait_refusing(base_url: str, timeout: float = 10.0) -> None:
    """Until new connections are refused: the server stopped admitting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(base_url + "/health/live", timeout=1.0)
        except httpx.TransportError:
            return
        time.sleep(0.02)
    raise AssertionError("the server kept accepting connections after SIGTERM")


def test_a_model_that_cannot_load_exits_1_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(
        [sys.executable, "-m", "embedserve", "serve", "--model", str(missing), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert f"model path {missing} is not a directory" in proc.stdout + proc.stderr
