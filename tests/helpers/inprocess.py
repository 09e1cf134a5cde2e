"""The server and the gateway in-process: a warmed-up server app behind FastAPI's TestClient, and
a gateway whose pools are that server app (httpx's ASGI transport: no sockets, no processes)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from embedserve.gateway.app import create_app as create_gateway_app
from embedserve.gateway.config import parse_config
from embedserve.gateway.counting import TokenCounter
from embedserve.gateway.forward import Forwarder
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.service import GatewayService
from embedserve.gateway.upstreams import UpstreamSet
from embedserve.server.app import create_app
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


def gateway_app(server_app: Any, model_dir: Path, api_keys: tuple[str, ...] = (), **config: Any) -> FastAPI:
    """A gateway with a short and a long pool, both served by `server_app` (already started);
    `api_keys`: the keys its own clients must send."""
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
    forwarder = Forwarder(upstreams, metrics, cfg.balance)
    service = GatewayService(cfg, TokenCounter(model_dir), upstreams, metrics, forwarder)
    return create_gateway_app(service, api_keys)
