"""Deadlines through the gateway (api/deadline.py), against fake upstreams: a pool's deadline 503
is answered 504 at once (never re-queued on the next pool), every call carries the time left,
and the gateway's own end-to-end deadline (request_timeout_s) bounds the client's wait."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from embedserve.api.protocol import ApiError, EmbeddingRequest
from embedserve.gateway.pools.config import GatewayConfigError, parse_config
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.service import POOLS_HEADER
from tests.helpers.gateway_fakes import LONG, SHORT, SHORT2, fake_gateway
from tests.helpers.server_process import words


@pytest.fixture(scope="module")
def counter(qwen3_dir: Path) -> TokenCounter:
    return TokenCounter(qwen3_dir)


def _request(*texts: str) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"input": list(texts)})


def test_a_pools_deadline_503_is_not_retried_on_the_next_pool(counter: TokenCounter) -> None:
    async def go() -> None:
        service, fakes = await fake_gateway(counter)()
        for url in (SHORT, SHORT2):
            fakes[url].status, fakes[url].error_type = 503, "deadline_exceeded"
        with pytest.raises(ApiError) as e:
            await service.embed(_request(words(3)), "online")
        assert e.value.status == 504 and e.value.kind == "deadline_exceeded"
        assert "not retried on another pool" in e.value.message
        assert len(fakes[SHORT].headers) + len(fakes[SHORT2].headers) == 1  # one call, no retry
        assert fakes[LONG].headers == []  # the long pool never saw it
        # Any other 503 (not ready, no capacity) still falls back along the route.
        for url in (SHORT, SHORT2):
            fakes[url].error_type = "service_unavailable"
        _, headers = await service.embed(_request(words(3)), "online")
        assert headers[POOLS_HEADER] == "long"

    asyncio.run(go())


def test_every_upstream_call_carries_the_time_left(counter: TokenCounter) -> None:
    async def go() -> None:
        service, fakes = await fake_gateway(counter)(request_timeout_s=20)
        await service.embed(_request(words(3), words(300)), "online")
        sent = [float(h["x-request-timeout"]) for f in fakes.values() for h in f.headers]
        assert len(sent) == 2 and all(0 < s <= 20 for s in sent), sent
        service, fakes = await fake_gateway(counter)()  # default: timeout_s (600 s)
        await service.embed(_request(words(3)), "online")
        sent = [float(h["x-request-timeout"]) for f in fakes.values() for h in f.headers]
        assert len(sent) == 1 and 590 < sent[0] <= 600

    asyncio.run(go())


def test_the_clients_timeout_can_only_shorten_the_deadline(counter: TokenCounter) -> None:
    async def go() -> None:
        for client_s, low, high in ((2.0, 1.5, 2.0), (100.0, 15.0, 20.0)):
            service, fakes = await fake_gateway(counter)(request_timeout_s=20)
            await service.embed(_request(words(3)), "online", client_s)
            sent = [float(h["x-request-timeout"]) for f in fakes.values() for h in f.headers]
            assert len(sent) == 1 and low < sent[0] <= high, (client_s, sent)

    asyncio.run(go())


def test_the_gateway_deadline_bounds_the_wait_on_a_slow_pool(counter: TokenCounter) -> None:
    async def go() -> None:
        service, fakes = await fake_gateway(counter)(request_timeout_s=0.4)
        for fake in fakes.values():
            fake.delay = 5.0  # a pool that ignores X-Request-Timeout
        start = time.monotonic()
        with pytest.raises(ApiError) as e:
            await service.embed(_request(words(3), words(300)), "online")
        waited = time.monotonic() - start
        assert e.value.status == 504 and e.value.kind == "deadline_exceeded", e.value.message
        assert "deadline of 0.4 s" in e.value.message and waited < 2.0, waited
        labels = {"traffic_class": "online", "reason": "deadline"}
        assert service.metrics.registry.get_sample_value("embedserve_gateway_rejections_total", labels) == 1

    asyncio.run(go())


def test_the_end_to_end_deadline_is_at_most_the_call_timeout() -> None:
    base = {
        "pools": {"p": {"max_tokens": 8, "upstreams": ["http://a:1"]}},
        "routes": [{"class": "online", "order": ["p"]}],
    }
    assert parse_config({**base, "request_timeout_s": 30}).deadline_s == 30
    assert parse_config(base).deadline_s == 600
    with pytest.raises(GatewayConfigError, match="request_timeout_s: 700 s is over timeout_s"):
        parse_config({**base, "request_timeout_s": 700})
    with pytest.raises(GatewayConfigError, match="request_timeout_s: expected a positive number"):
        parse_config({**base, "request_timeout_s": 0})
