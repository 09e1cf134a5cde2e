"""Keep-alive races on loopback (issue #27): a pool that closes a pooled connection exactly as the
gateway reuses it, a pool killed mid-request, and the keep-alive / Retry-After ordering that keeps
clients from ever sending on a connection the server is closing (api/keepalive.py)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from embedserve.api.keepalive import KEEP_ALIVE_S, MAX_RETRY_AFTER_S, UPSTREAM_KEEPALIVE_EXPIRY_S
from embedserve.api.protocol import ApiError, EmbeddingRequest
from embedserve.gateway.cli import register, uvicorn_config
from embedserve.gateway.pools.config import parse_config
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import Forwarder, Part, PartResult
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.upstreams import UpstreamSet
from embedserve.server.runtime import ServerSettings
from tests.helpers.gateway_fakes import fake_gateway
from tests.helpers.raw_upstream import Drop, RawUpstream, raw_upstream
from tests.helpers.server_process import words

HTTPX_DEFAULT_EXPIRY_S = httpx.Limits().keepalive_expiry  # 5 s, the soak's and OpenAI clients'


async def _forwarder(up: RawUpstream) -> tuple[Forwarder, UpstreamSet]:
    config = parse_config(
        {
            "pools": {"short": {"max_tokens": 64, "upstreams": [up.url]}},
            "routes": [{"class": "online", "order": ["short"]}],
        }
    )
    limits = httpx.Limits(keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY_S)
    upstreams = UpstreamSet(config, httpx.AsyncClient(limits=limits, timeout=10))
    await upstreams.start()
    await upstreams.close()  # no background polls: each test says what the pool does
    await upstreams.client.aclose()  # and requests start without the polls' connection
    upstreams.client = httpx.AsyncClient(limits=limits, timeout=10)
    return Forwarder(upstreams, GatewayMetrics(upstreams), config.balance), upstreams


def _part(text: str) -> Part:
    return Part(("short",), [0], 2, {"input": [text]})


async def _twice(drop: Drop) -> tuple[RawUpstream, UpstreamSet, list[PartResult | ApiError]]:
    """Two parts one after the other (the second can reuse the first's connection)."""
    async with raw_upstream(drop) as up:
        forwarder, upstreams = await _forwarder(up)
        out: list[PartResult | ApiError] = []
        for text in ("first", "second"):
            try:
                out.append(await forwarder.run(_part(text), "online"))
            except ApiError as e:
                out.append(e)
        await upstreams.client.aclose()
        return up, upstreams, out


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_a_pooled_connection_closed_as_it_is_reused_is_resent_not_failed(how: str) -> None:
    """The pool drops the second request on the kept-alive connection unread (its keep-alive
    timer fired as the request arrived): the gateway resends it on a new connection, answers
    200 and keeps the pool in rotation. Before the fix: 503 and the pool marked down."""
    up, upstreams, (first, second) = asyncio.run(_twice(lambda conn, nth: how if nth == 1 else None))
    assert isinstance(first, PartResult) and isinstance(second, PartResult)
    assert second.body["data"][0]["embedding"] == [float(len("second"))]
    assert up.dropped == [(1, 1, "/v1/embeddings")]  # on the reused connection (0: the polls')
    assert up.answered == [(1, 0, "/v1/embeddings"), (2, 0, "/v1/embeddings")]  # resent on a new one
    assert upstreams.available() == {"short"}


def test_a_fresh_connection_that_breaks_is_not_resent() -> None:
    """A request that breaks on a connection opened for it is not the keep-alive race: the pool
    is failing, so it leaves rotation and the client gets a status (503 + Retry-After)."""
    up, upstreams, (first, second) = asyncio.run(_twice(lambda conn, nth: "rst"))
    assert isinstance(first, ApiError) and first.status == 503 and "Retry-After" in first.headers
    assert up.dropped == [(1, 0, "/v1/embeddings")]  # not resent
    assert upstreams.available() == set()
    assert isinstance(second, ApiError) and second.status == 503


def test_a_pool_killed_mid_request_gets_a_status() -> None:
    """A reused connection reset and the pool no longer listening (SIGKILL): one resend finds it
    refused, the pool leaves rotation and the client gets 503 with Retry-After, never a dropped
    connection."""

    async def go() -> tuple[RawUpstream, UpstreamSet, ApiError]:
        async with raw_upstream(lambda conn, nth: None) as up:
            forwarder, upstreams = await _forwarder(up)
            await forwarder.run(_part("first"), "online")
            assert up.server is not None
            up.server.close()  # no new connections from now on
            up.drop = lambda conn, nth: "rst"
            with pytest.raises(ApiError) as e:
                await forwarder.run(_part("second"), "online")
            await upstreams.client.aclose()
            return up, upstreams, e.value

    up, upstreams, error = asyncio.run(go())
    assert error.status == 503 and error.headers == {"Retry-After": "1"}
    assert up.dropped == [(1, 1, "/v1/embeddings")]
    assert upstreams.available() == set()


def test_upstream_expiry_is_below_every_pool_keep_alive() -> None:
    assert UPSTREAM_KEEPALIVE_EXPIRY_S < 5.0  # uvicorn's default keep-alive, a pool's worst case
    assert ServerSettings(model="m").timeout_keep_alive_s > UPSTREAM_KEEPALIVE_EXPIRY_S


def _gateway_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def _gateway_args(*argv: str) -> argparse.Namespace:
    return _gateway_parser().parse_args(["gateway", "--config", "pools.yaml", *argv])


def test_gateway_help_names_its_keep_alive() -> None:
    subparsers = next(a for a in _gateway_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(subparsers.choices["gateway"].format_help().split())
    assert "--timeout-keep-alive" in text and f"(default: {KEEP_ALIVE_S:g})" in text


def test_gateway_keep_alive_outlasts_client_expiry_and_retry_after() -> None:
    args = _gateway_args()
    assert args.timeout_keep_alive == KEEP_ALIVE_S
    assert uvicorn_config(FastAPI(), args).timeout_keep_alive > MAX_RETRY_AFTER_S >= HTTPX_DEFAULT_EXPIRY_S
    assert uvicorn_config(FastAPI(), _gateway_args("--timeout-keep-alive", "90")).timeout_keep_alive == 90


def test_server_keep_alive_outlasts_client_expiry_and_retry_after() -> None:
    assert ServerSettings(model="m").timeout_keep_alive_s > MAX_RETRY_AFTER_S >= HTTPX_DEFAULT_EXPIRY_S


def test_gateway_caps_a_pools_retry_after_below_its_keep_alive(qwen3_dir: Path) -> None:
    """A pool's Retry-After of 600 s is passed on as MAX_RETRY_AFTER_S: a client that waits as
    told and reuses its connection finds it still open."""

    async def go() -> ApiError:
        service, fakes = await fake_gateway(TokenCounter(qwen3_dir))()
        for f in fakes.values():
            f.status, f.retry_after = 429, "600"
        with pytest.raises(ApiError) as e:
            await service.embed(EmbeddingRequest.model_validate({"input": [words(3)]}), "online")
        return e.value

    error = asyncio.run(go())
    assert error.status == 429 and error.headers == {"Retry-After": str(MAX_RETRY_AFTER_S)}
    assert int(error.headers["Retry-After"]) < KEEP_ALIVE_S
