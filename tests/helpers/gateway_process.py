"""Run `embedserve gateway` as a real process on 127.0.0.1 (free port) for integration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.server_process import ServerProcess, free_port


def write_config(
    path: Path, model: Path, pools: dict[str, Any], routes: list[dict[str, Any]], **extra: Any
) -> Path:
    path.write_text(yaml.safe_dump({"model": str(model), "pools": pools, "routes": routes, **extra}))
    return path


def start_gateway(config: Path, log_dir: Path, *args: str) -> ServerProcess:
    """`args`: more `embedserve gateway` options."""
    port = free_port()
    log_path = log_dir / f"gateway-{port}.log"
    cmd = [sys.executable, "-m", "embedserve", "gateway", "--config", str(config), "--port", str(port), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
