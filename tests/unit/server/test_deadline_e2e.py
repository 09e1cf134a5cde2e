"""Request deadlines in-process: the server honours the caller's X-Request-Timeout (503
`deadline_exceeded`, its work cancelled), and through a gateway whose pools are that server a
deadline expiring in a pool reaches the client once, as 504, without a second wait elsewhere."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.helpers.inprocess import gateway_app, runtime_of, server_client, slow_steps


@pytest.fixture(scope="module")
def server(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir) as c:  # --request-timeout: the default 300 s
        yield c


@pytest.fixture
def slow(server: TestClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with slow_steps(server, monkeypatch):
        yield


def _status_count(server: TestClient, status: str) -> float:
    metrics = runtime_of(server).metrics
    return metrics.registry.get_sample_value("embedserve_requests_total", {"status": status}) or 0.0


@pytest.mark.usefixtures("slow")
@pytest.mark.parametrize(
    ("path", "body"), [("/v1/embeddings", {"input": "slow"}), ("/v2/embed", {"texts": ["slow"]})]
)
def test_the_server_honours_the_callers_timeout(server: TestClient, path: str, body: dict[str, Any]) -> None:
    start = time.monotonic()
    resp = server.post(path, json=body, headers={"X-Request-Timeout": "0.3"})
    assert time.monotonic() - start < 1.5  # well before the first step (2 s) ends
    error = resp.json()["error"]
    assert resp.status_code == 503 and error["type"] == "deadline_exceeded", resp.text
    assert "within 0.3 s (x-request-timeout" in error["message"]
    assert resp.headers["retry-after"].isdigit()


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_an_unreadable_timeout_header_is_a_400(server: TestClient, value: str) -> None:
    resp = server.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": value})
    assert resp.status_code == 400 and "x-request-timeout" in resp.json()["error"]["message"]


@pytest.mark.usefixtures("slow")
def test_a_pool_deadline_reaches_the_gateway_client_once(server: TestClient, qwen3_dir: Path) -> None:
    gateway = TestClient(gateway_app(server.app, qwen3_dir, request_timeout_s=1.0))
    before = _status_count(server, "503")
    start = time.monotonic()
    resp = gateway.post("/v1/embeddings", json={"input": "a short text"})
    waited = time.monotonic() - start
    error = resp.json()["error"]
    assert resp.status_code == 504 and error["type"] == "deadline_exceeded", resp.text
    assert "pool 'short'" in error["message"] and "not retried on another pool" in error["message"]
    assert waited < 1.9, waited  # the deadline, not the 2 s step
    assert _status_count(server, "503") == before + 1  # the long pool was never asked
