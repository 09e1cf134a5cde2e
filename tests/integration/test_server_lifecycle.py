"""Process lifecycle: graceful SIGTERM under load, Ctrl-C, and a model that cannot load."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.helpers.gateway_process import write_config
from tests.helpers.server_process import ServerProcess, free_port, start_server, words


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


def _started(cmd: list[str], port: int, log: Path) -> ServerProcess:
    with log.open("wb") as out:
        # SIGINT's default restored: a child of a non-interactive shell may inherit it ignored
        proc = subprocess.Popen(
            [sys.executable, "-m", "embedserve", *cmd, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return ServerProcess(proc, f"http://127.0.0.1:{port}", log)


def _ctrl_c(process: ServerProcess) -> int:
    try:
        process.proc.send_signal(signal.SIGINT)
        return process.proc.wait(60)
    finally:
        process.terminate()


def test_ctrl_c_drains_and_exits_0_without_a_traceback(qwen3_dir: Path, tmp_path: Path) -> None:
    """Ctrl-C in a terminal is SIGINT: the same drain as SIGTERM, not KeyboardInterrupt's
    traceback and exit 130 (uvicorn re-raises the signal it caught once it has shut down)."""
    cmd = ["serve", "--model", str(qwen3_dir), "--warmup-lengths", "16"]
    server = _started(cmd, free_port(), tmp_path / "serve.log")
    try:
        server.wait_ready()
        reply = httpx.post(server.base_url + "/v1/embeddings", json={"input": "hi"}, timeout=60)
        assert reply.status_code == 200
    finally:
        rc = _ctrl_c(server)
    assert rc == 0, server.log()
    assert "Traceback" not in server.log() and "shutdown complete" in server.log()


def test_the_gateway_takes_ctrl_c_the_same_way(qwen3_dir: Path, tmp_path: Path) -> None:
    pools = {"short": {"max_tokens": 256, "upstreams": [f"http://127.0.0.1:{free_port()}"]}}
    config = write_config(tmp_path / "g.yaml", qwen3_dir, pools, [{"class": "online", "order": ["short"]}])
    gateway = _started(["gateway", "--config", str(config)], free_port(), tmp_path / "gateway.log")
    try:
        deadline = time.monotonic() + 120
        while _live(gateway.base_url) != 200:  # its pool is not up: live, never ready
            assert gateway.proc.poll() is None and time.monotonic() < deadline, gateway.log()
            time.sleep(0.05)
    finally:
        rc = _ctrl_c(gateway)
    assert rc == 0, gateway.log()
    assert "Traceback" not in gateway.log()


def _live(base_url: str) -> int:
    try:
        return httpx.get(base_url + "/health/live", timeout=2).status_code
    except httpx.TransportError:
        return 0


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
