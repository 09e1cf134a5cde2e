"""Integration fixtures: one real `embedserve serve` process shared by the API tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from embedserve import Engine
from tests.helpers.server_process import ServerProcess, start_server

API_KEY = "test-key"
MODEL_NAME = "tiny-qwen3"
MAX_MODEL_LEN = 8192
MAX_QUEUED_INPUTS = 8


@pytest.fixture(scope="session")
def api_server(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Small queue bounds (overload is easy to reach) and an 8K-token warm-up (long enough that
    readiness is observably 503 before it completes)."""
    server = start_server(
        qwen3_dir,
        tmp_path_factory.mktemp("server-logs"),
        "--served-model-name",
        MODEL_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--warmup-lengths",
        f"16,{MAX_MODEL_LEN}",
        "--max-queued-requests",
        str(MAX_QUEUED_INPUTS),
        "--max-inputs-per-request",
        str(MAX_QUEUED_INPUTS),
        "--max-body-bytes",
        "1000000",
        env={"EMBEDSERVE_API_KEY": API_KEY},
    )
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.terminate() == 0, server.log()


@pytest.fixture(scope="session")
def ref_engine(qwen3_dir: Path) -> Iterator[Engine]:
    """The engine in-process, configured like the server: what the server's vectors must equal."""
    with Engine.from_pretrained(qwen3_dir, max_model_len=MAX_MODEL_LEN) as engine:
        yield engine
