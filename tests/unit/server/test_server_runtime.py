"""Readiness follows the engine's health: failed forwards, a dead engine, a failed load, a drain.

In-process (FastAPI's TestClient runs the app's lifespan); faults are injected into the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from embedserve.server.app import create_app
from embedserve.server.runtime import ServerRuntime, ServerSettings


def _wait_phase(client: TestClient, phase: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/health/live").json()["phase"] == phase:
            return
        time.sleep(0.02)
    raise AssertionError(f"phase {phase!r} not reached: {client.get('/health/ready').json()}")


@pytest.fixture()
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    app = create_app(ServerSettings(model=str(qwen3_dir), warmup_lengths=(16,)))
    with TestClient(app) as c:
        _wait_phase(c, "ready")
        yield c


def _runtime(client: TestClient) -> ServerRuntime:
    runtime: ServerRuntime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def test_a_failed_forward_pass_is_a_500_and_readiness_probes_before_recovering(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _runtime(client).engine
    assert engine is not None
    runner = engine._loop.core.runner
    real_execute = runner.execute
    failing = {"on": True}

    def execute(out: Any) -> Any:
        if failing["on"]:
            raise RuntimeError("injected device fault")
        return real_execute(out)

    monkeypatch.setattr(runner, "execute", execute)
    resp = client.post("/v1/embeddings", json={"input": "hello"})
    assert resp.status_code == 500 and "injected device fault" in resp.json()["error"]["message"]
    ready = client.get("/health/ready")  # its probe forward fails too
    assert ready.status_code == 503 and "probe failed" in ready.json()["detail"]
    failing["on"] = False
    assert client.get("/health/ready").status_code == 200  # the probe now succeeds
    assert client.post("/v1/embeddings", json={"input": "hello"}).status_code == 200
    metrics = client.get("/metrics").text
    assert 'embedserve_requests_total{status="500"} 1.0' in metrics


def test_a_dead_engine_turns_readiness_and_requests_into_503(client: TestClient) -> None:
    engine = _runtime(client).engine
    assert engine is not None
    engine.close()  # the runtime then restarts it (test_faults.py follows that through)
    ready = client.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["detail"] in (
        "the engine loop has stopped",
        "restarting",
    )
    resp = client.post("/v1/embeddings", json={"input": "hello"})
    assert resp.status_code == 503 and "retry-after" in resp.headers
    assert client.get("/health/live").status_code == 200


def test_draining_refuses_new_work_with_503(client: TestClient) -> None:
    _runtime(client).begin_drain()
    assert client.get("/health/ready").json() == {"status": "not_ready", "detail": "draining"}
    resp = client.post("/v1/embeddings", json={"input": "hello"})
    assert resp.status_code == 503 and "draining" in resp.json()["error"]["message"]


def test_a_failed_load_reports_why_and_calls_on_fatal(tmp_path: Path) -> None:
    reasons: list[str] = []
    app = create_app(ServerSettings(model=str(tmp_path / "missing")), on_fatal=reasons.append)
    with TestClient(app) as c:
        _wait_phase(c, "failed")
        ready = c.get("/health/ready")
        assert ready.status_code == 503 and "is not a directory" in ready.json()["detail"]
        assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 503
    assert len(reasons) == 1 and "ModelLoadError" in reasons[0]


def test_settings_refuse_bounds_that_could_never_admit_a_full_request() -> None:
    with pytest.raises(ValueError, match="could never be admitted"):
        ServerSettings(model="m", max_queued_requests=4, max_inputs_per_request=8)
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerSettings(model="m", max_body_bytes=0)


def test_routing_errors_use_the_api_error_shape(client: TestClient) -> None:
    missing = client.get("/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Not Found: GET /v1/nothing"
    assert client.get("/v1/embeddings").status_code == 405
