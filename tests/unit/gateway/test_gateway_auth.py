"""The gateway's own API keys: its clients need `Authorization: Bearer KEY` (401 without), health
stays open, the key is never logged nor forwarded (the pools get the upstream key, if any)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from embedserve.errors import EmbedServeError
from embedserve.gateway.app import create_app
from embedserve.gateway.cli import client_api_keys
from embedserve.gateway.live import Live
from embedserve.gateway.pools.counting import TokenCounter
from tests.helpers.gateway_fakes import fake_gateway
from tests.helpers.inprocess import gateway_app, server_client

KEYS = ("gw-key-one", "gw-key-two")


@pytest.fixture(scope="module")
def gateway(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir) as server:
        yield TestClient(gateway_app(server.app, qwen3_dir, api_keys=KEYS))


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/embeddings", {"input": "x"}),
        ("post", "/v2/embed", {"texts": ["x"]}),
        ("get", "/v1/models", None),
        ("get", "/metrics", None),
    ],
)
def test_401_without_a_valid_key_200_with_one(
    gateway: TestClient,
    method: str,
    path: str,
    body: dict[str, object] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    call = getattr(gateway, method)
    kwargs = {"json": body} if body is not None else {}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEYS[0]}"}):
        resp = call(path, headers=headers, **kwargs)
        assert resp.status_code == 401, (headers, resp.text)
        assert resp.json()["error"]["type"] == "authentication_error"
        assert resp.headers["www-authenticate"] == "Bearer"
    for key in KEYS:
        resp = call(path, headers={"Authorization": f"Bearer {key}"}, **kwargs)
        assert resp.status_code == 200, resp.text
    assert not any(k in caplog.text for k in KEYS)  # never logged


def test_health_stays_open(gateway: TestClient) -> None:
    assert gateway.get("/health/live").status_code == 200
    assert gateway.get("/health/ready").status_code == 200


def test_the_openapi_document_lists_401(gateway: TestClient) -> None:
    doc = gateway.get("/openapi.json").json()
    for path in ("/v1/embeddings", "/v2/embed", "/v1/score"):
        assert "401" in doc["paths"][path]["post"]["responses"], path


def test_the_clients_key_is_not_forwarded_to_the_pools(qwen3_dir: Path) -> None:
    service, fakes = asyncio.run(fake_gateway(TokenCounter(qwen3_dir))())
    client = TestClient(create_app(Live.of(service), KEYS))
    resp = client.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"Bearer {KEYS[0]}"})
    assert resp.status_code == 200, resp.text
    sent = [h for f in fakes.values() for h in f.headers]
    assert len(sent) == 1 and "authorization" not in sent[0]


def test_keys_from_the_command_line_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDSERVE_GATEWAY_API_KEY", "env-a, env-b")
    monkeypatch.setenv("MY_GW_KEYS", "cfg-a,")
    assert client_api_keys(["cli-a"], "MY_GW_KEYS") == ("cli-a", "env-a", "env-b", "cfg-a")
    monkeypatch.delenv("EMBEDSERVE_GATEWAY_API_KEY")
    assert client_api_keys(None, None) == ()
    with pytest.raises(EmbedServeError, match=r"api_keys_env: \$NOT_SET_HERE is not set"):
        client_api_keys(None, "NOT_SET_HERE")
