"""The server and the gateway in-process: a warmed-up server app behind FastAPI's TestClient, a
gateway whose pools are that server app (httpx's ASGI transport: no sockets, no processes), and
the Ray Serve ingress without Ray: its pools' handles run the replica's code on that server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from embedserve.batch.settings import BatchSettings
from embedserve.gateway.app import create_app as create_gateway_app
from embedserve.gateway.batch_lines import gateway_batch_jobs
from embedserve.gateway.live import Live
from embedserve.gateway.pools.config import parse_config
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import Forwarder
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.upstreams import UpstreamSet
from embedserve.gateway.service import GatewayService
from embedserve.server.app import create_app, model_card
from embedserve.server.runtime import ServerRuntime, ServerSettings


def wait_phase(client: TestClient, phase: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/health/live").json()["phase"] == phase:
            return
        time.sleep(0.02)
    raise AssertionError(f"phase {phase!r} not reached: {client.get('/health/ready').json()}")


@contextlib.contextmanager
def server_client(model_dir: Path, **settings: Any) -> Iterator[TestClient]:
    """A ready server app (its lifespan running) and a client for it."""
    settings.setdefault("warmup_lengths", (16,))
    app = create_app(ServerSettings(model=str(model_dir), **settings))
    with TestClient(app, raise_server_exceptions=False) as c:
        wait_phase(c, "ready")
        yield c


def runtime_of(client: TestClient) -> ServerRuntime:
    runtime: ServerRuntime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def gateway_app(
    server_app: Any,
    model_dir: Path,
    api_keys: tuple[str, ...] = (),
    tracing: Any = None,
    batch_dir: Path | None = None,
    **config: Any,
) -> FastAPI:
    """A gateway with a short and a long pool, both served by `server_app` (already started);
    `api_keys`: the keys its own clients must send; `tracing`: its tracer (tracing/otel.py);
    `batch_dir`: its online batch API's folder (running while the app's lifespan does)."""
    cfg = parse_config(
        {
            "pools": {
                "short": {"max_tokens": 64, "upstreams": ["http://short:1"]},
                "long": {"max_tokens": 512, "upstreams": ["http://long:2"]},
            },
            "routes": [
                {"class": "online", "order": ["short", "long"]},
                {"class": "batch", "order": ["long"]},
            ],
            **config,
        }
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=server_app))
    upstreams = UpstreamSet(cfg, client)

    async def poll_once() -> None:
        await upstreams.start()
        await upstreams.close()  # no background polling: one look at the pools is enough here

    asyncio.run(poll_once())
    metrics = GatewayMetrics(upstreams)
    forwarder = Forwarder(upstreams, metrics, cfg.balance, tracing)
    service = GatewayService(cfg, TokenCounter(model_dir), upstreams, metrics, forwarder, tracing)
    live = Live.of(service)
    jobs = None if batch_dir is None else (gateway_batch_jobs(BatchSettings(batch_dir), live), 1 << 20)
    return create_gateway_app(live, api_keys, jobs)


@contextlib.contextmanager
def slow_steps(client: TestClient, monkeypatch: pytest.MonkeyPatch, seconds: float = 2.0) -> Iterator[None]:
    """Every engine step of the server takes `seconds` longer; afterwards, the work a deadline
    cancelled must have freed its KV blocks."""
    engine = runtime_of(client).engine
    assert engine is not None
    runner = engine._loop.core.runner
    real = runner.execute

    def execute(out: Any) -> Any:
        time.sleep(seconds)
        return real(out)

    monkeypatch.setattr(runner, "execute", execute)
    try:
        yield
    finally:
        monkeypatch.undo()
    deadline = time.monotonic() + 10
    while engine.stats()["kv_blocks_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["kv_blocks_used"] == 0  # the cancelled work freed its blocks


class LocalReplica:
    """A pool deployment's handle without Ray (`request.remote`, `card.remote`): the replica's
    code (scale/replica.py) on a started server's runtime; records what each call was told."""

    def __init__(self, runtime: ServerRuntime) -> None:
        self.runtime = runtime
        self.calls: list[tuple[str, float | None]] = []  # (path, timeout_s)
        self.request = SimpleNamespace(remote=self._request)
        self.card = SimpleNamespace(remote=self._card)

    async def _request(self, path: str, payload: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        from embedserve.scale.replica import answer

        self.calls.append((path, timeout_s))
        return await answer(self.runtime, self.runtime.metrics, path, payload, timeout_s)

    async def _card(self) -> dict[str, Any]:
        assert self.runtime.service is not None
        return model_card(self.runtime.service)


def ingress_app(
    server: TestClient, model_dir: Path, **config: Any
) -> tuple[FastAPI, dict[str, LocalReplica]]:
    """The Ray Serve ingress's app (scale/ingress.py) with a short and a long pool whose replicas
    are `server`'s runtime (LocalReplica), and those replicas."""
    from embedserve.scale.config import parse_scale_config
    from embedserve.scale.ingress_app import serve_gateway

    cfg = parse_scale_config(
        {
            "model": str(model_dir),
            "pools": {"short": {"max_tokens": 64}, "long": {"max_tokens": 512}},
            "routes": [
                {"class": "online", "order": ["short", "long"]},
                {"class": "batch", "order": ["long"]},
            ],
            **config,
        }
    )
    replicas = {p.name: LocalReplica(runtime_of(server)) for p in cfg.pools}
    service, _ = asyncio.run(serve_gateway(cfg, replicas, TokenCounter(model_dir)))
    return create_gateway_app(Live.of(service)), replicas


class Via(httpx.BaseTransport):
    """A synchronous client's requests answered by the app behind a TestClient (its lifespan
    running): index's and parity's HTTP embedders on an in-process server."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.client.request(
            request.method, str(request.url), content=request.read(), headers=request.headers
        )
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)
