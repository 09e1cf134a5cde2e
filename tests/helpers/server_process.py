"""Run `embedserve serve` as a real process on 127.0.0.1 (free port) for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_VOCAB = ["the", "cat", "sat", "on", "a", "mat", "while", "dog", "ran", "far", "away", "from", "home", "sun"]


def words(n: int, seed: int = 0) -> str:
    """Text of n words that are single tokens for the Qwen tokenizer (n + 1 tokens with the end token)."""
    return " ".join(_VOCAB[(i * 7 + seed * 3 + i // 5) % len(_VOCAB)] for i in range(n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    # (liveness status, readiness status) pairs seen while waiting for readiness; 0 = no answer.
    startup: list[tuple[int, int]] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Until /health/ready is 200 (generous: a busy CI machine imports torch and warms up slowly)."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base_url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
                live, ready = _status(client, "/health/live"), _status(client, "/health/ready")
                self.startup.append((live, ready))
                if ready == 200:
                    return
                time.sleep(0.02)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log()}")

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def _status(client: httpx.Client, path: str) -> int:
    try:
        return client.get(path).status_code
    except httpx.TransportError:
        return 0


def start_server(
    model_dir: Path, log_dir: Path, *args: str, env: dict[str, str] | None = None
) -> ServerProcess:
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "embedserve", "serve", "--model", str(model_dir), "--port", str(port), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
