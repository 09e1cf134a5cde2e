"""Split, forward, fall back and reassemble, against fake upstreams (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedserve.api.protocol import ApiError, EmbeddingRequest
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.service import POOLS_HEADER, GatewayService
from tests.helpers.gateway_fakes import LONG, SCHEMA, SHORT, SHORT2, fake_gateway
from tests.helpers.server_process import words

Run = Callable[..., Any]


@pytest.fixture(scope="module")
def counter(qwen3_dir: Path) -> TokenCounter:
    return TokenCounter(qwen3_dir)


@pytest.fixture
def gateway(counter: TokenCounter) -> Run:
    return fake_gateway(counter)


def _request(*texts: str, **extra: Any) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"input": list(texts), **extra})


def _metric(service: GatewayService, name: str, **labels: str) -> float:
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def test_split_across_pools_and_reassembled_in_order(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        texts = [words(5), words(200), words(7), words(300, seed=1), words(9)]
        body, headers = await service.embed(_request(*texts), "online")
        assert [d["embedding"][0] for d in body["data"]] == [len(t) for t in texts]
        assert [d["index"] for d in body["data"]] == list(range(5))
        assert [d["pool"] for d in body["data"]] == ["short", "long", "short", "long", "short"]
        assert body["usage"]["prompt_tokens"] == sum(len(t.split()) + 1 for t in texts)
        assert body["embedding_schema"] == SCHEMA and body["model"] == "tiny"
        assert headers[POOLS_HEADER] == "short,long" and headers["x-queue-time"] == "1.50"
        assert fakes[LONG].inputs == [[texts[1], texts[3]]]
        assert (
            _metric(service, "embedserve_gateway_pool_inputs_total", pool="long", traffic_class="online") == 2
        )

    asyncio.run(go())


def test_batch_class_uses_its_own_route(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        _, headers = await service.embed(_request(words(3)), "batch")
        assert headers[POOLS_HEADER] == "long" and fakes[SHORT].inputs == fakes[SHORT2].inputs == []

    asyncio.run(go())


def test_round_robin_spreads_over_a_pools_upstreams(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway("round_robin")
        for _ in range(4):
            await service.embed(_request(words(3)), "online")
        assert len(fakes[SHORT].inputs) == len(fakes[SHORT2].inputs) == 2

    asyncio.run(go())


def test_saturated_pool_falls_back_to_the_next_in_route_order(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        fakes[SHORT].status = fakes[SHORT2].status = 429
        body, headers = await service.embed(_request(words(3), words(4)), "online")
        assert headers[POOLS_HEADER] == "long" and len(body["data"]) == 2
        labels = {"pool": "short", "traffic_class": "online"}
        assert _metric(service, "embedserve_gateway_fallbacks_total", reason="rejected", **labels) == 1
        assert _metric(service, "embedserve_gateway_pool_requests_total", outcome="rejected", **labels) == 2

    asyncio.run(go())


def test_everything_saturated_gives_429_with_the_longest_retry_after(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        for f, wait in ((fakes[SHORT], "3"), (fakes[SHORT2], "2"), (fakes[LONG], "7")):
            f.status, f.retry_after = 429, wait
        with pytest.raises(ApiError) as e:
            await service.embed(_request(words(3)), "online")
        assert e.value.status == 429 and e.value.headers == {"Retry-After": "7"}

    asyncio.run(go())


def test_unreachable_upstream_leaves_rotation_and_traffic_moves_on(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        fakes[SHORT].raises = fakes[SHORT2].raises = httpx.ConnectError("refused")
        _, headers = await service.embed(_request(words(3)), "online")
        assert headers[POOLS_HEADER] == "long"
        assert service.upstreams.available() == {"long"}
        # Later requests skip the dead pool at routing time (counted as a fallback too).
        await service.embed(_request(words(3)), "online")
        labels = {"pool": "short", "traffic_class": "online"}
        assert _metric(service, "embedserve_gateway_fallbacks_total", reason="unavailable", **labels) == 1
        fakes[LONG].raises = httpx.ConnectError("refused")
        with pytest.raises(ApiError) as e:
            await service.embed(_request(words(3)), "online")
        assert e.value.status == 503 and "Retry-After" in e.value.headers

    asyncio.run(go())


def test_one_failing_part_fails_the_whole_request(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        fakes[LONG].status = 422
        with pytest.raises(ApiError) as e:
            await service.embed(_request(words(3), words(300)), "online")
        assert (
            e.value.status == 422
            and "pool 'long'" in e.value.message
            and "request inputs [1]" in e.value.message
        )
        fakes[LONG].status = 500
        with pytest.raises(ApiError) as e:
            await service.embed(_request(words(300)), "online")
        assert e.value.status == 502

    asyncio.run(go())


def test_parts_with_different_schemas_are_never_mixed(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        fakes[LONG].schema = "es1-other"  # changed after the guard admitted it
        with pytest.raises(ApiError, match="different embedding schemas") as e:
            await service.embed(_request(words(3), words(300)), "online")
        assert e.value.status == 502

    asyncio.run(go())


def test_refusals_before_any_upstream_call(gateway: Run) -> None:
    async def go() -> None:
        service, fakes = await gateway()
        cases = [
            (_request(words(5000)), 400, "input 0: 5001 tokens exceed the limit of 4096"),
            (_request(words(3), prompt_name="nope"), 400, "unknown prompt name 'nope'"),
            (_request(words(3), model="other"), 404, "this gateway serves 'tiny'"),
            (
                EmbeddingRequest.model_validate({"input": [[1, 2], [10**9]]}),
                400,
                "input 1: token id 1000000000",
            ),
        ]
        for req, status, message in cases:
            with pytest.raises(ApiError) as e:
                await service.embed(req, "online")
            assert (e.value.status, message in e.value.message) == (status, True), e.value.message
        assert all(not f.inputs for f in fakes.values())

    asyncio.run(go())
