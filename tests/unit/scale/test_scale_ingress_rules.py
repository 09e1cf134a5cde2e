"""The Ray Serve ingress's part runner (scale/ingress.py) with stub deployment handles: each
route reaches the replica's handler for it, every call carries the time left of the request's
deadline, an expired part is never sent (nor retried on another replica or pool), a pool's
deadline 503 ends the part with 504 (not re-queued on the next pool, as the HTTP gateway), any
other 503 falls back, the schema guard reads the replica's schema, not the body's, and a pool's
`max_inflight_tokens` is shared by tenants' weights as the HTTP gateway shares it."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from embedserve.api.protocol import ApiError
from embedserve.gateway.pools.fair import CURRENT_TENANT, FairGate
from embedserve.gateway.pools.forward import Part
from embedserve.gateway.pools.metrics import GatewayMetrics

pytest.importorskip("ray")
from embedserve.scale.ingress import ServeRunner

SCHEMA = "es1-pool"
BODIES: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {
        "data": [{"object": "embedding", "index": 0, "embedding": [1.0], "num_tokens": 2}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
        "embedding_schema": SCHEMA,
    },
    "/v2/embed": {"embeddings": {"float": [[1.0]], "int8": [[3]]}, "embedding_schema": "es1-other"},
    "/v1/rerank": {"results": [{"index": 0, "relevance_score": 0.5}], "embedding_schema": SCHEMA},
}


class Died(Exception):
    """Stands for Ray's replica-death errors (ServeRunner.failures)."""


class StubHandle:
    """A pool deployment's handle: `request.remote(path, payload, timeout_s)` records the call
    and answers `status` (with `error_type`), or raises Died `dies` times first."""

    def __init__(self, status: int, error_type: str = "service_unavailable", dies: int = 0) -> None:
        self.calls: list[tuple[str, dict[str, Any], float | None]] = []
        self.status, self.error_type, self.dies = status, error_type, dies
        self.schema = SCHEMA
        self.delay = 0.0
        self.retry_after = "2"
        self.request = SimpleNamespace(remote=self._remote)

    async def _remote(self, path: str, payload: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        self.calls.append((path, payload, timeout_s))
        await asyncio.sleep(self.delay)
        if len(self.calls) <= self.dies:
            raise Died("replica died")
        reply: dict[str, Any] = {"status": self.status, "headers": {"Retry-After": self.retry_after}}
        reply["embedding_schema"] = self.schema
        if self.status == 200:
            reply["body"] = BODIES[path]
        else:
            reply["body"] = {"error": {"message": "waited too long", "type": self.error_type}}
        return reply


def _runner(handles: dict[str, StubHandle], gates: dict[str, FairGate] | None = None) -> ServeRunner:
    pools = SimpleNamespace(handles=handles, schema=SCHEMA, mark_down=lambda *_: None, gates=gates or {})
    runner = ServeRunner(pools, GatewayMetrics(None))  # type: ignore[arg-type]
    runner.failures = (Died,)
    return runner


def _run(handles: dict[str, StubHandle], part: Part) -> Any:
    return asyncio.run(_runner(handles).run(part, "online"))


def _part(path: str = "/v1/embeddings", deadline_in: float | None = None) -> Part:
    deadline = None if deadline_in is None else time.monotonic() + deadline_in
    payloads = {"/v1/embeddings": {"input": ["x"]}, "/v2/embed": {"texts": ["x"]}}
    payload = payloads.get(path, {"query": "q", "documents": ["x"]})
    return Part(("short", "long"), [0], 2, payload, path, deadline)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v2/embed", "/v1/rerank"])
def test_each_route_reaches_the_replicas_handler_with_the_time_left(path: str) -> None:
    handles = {"short": StubHandle(200), "long": StubHandle(200)}
    result = _run(handles, _part(path, deadline_in=20.0))
    assert result.pool == "short" and result.body == BODIES[path]  # /v2/embed: its own schema
    ((sent_path, payload, timeout_s),) = handles["short"].calls
    assert sent_path == path and payload == _part(path).payload
    assert timeout_s is not None and 17.0 < timeout_s < 20.0
    assert handles["long"].calls == []


def test_without_a_deadline_the_replica_is_told_none() -> None:
    handles = {"short": StubHandle(200), "long": StubHandle(200)}
    _run(handles, _part())
    assert handles["short"].calls[0][2] is None


def test_a_part_past_its_deadline_is_not_sent() -> None:
    handles = {"short": StubHandle(200), "long": StubHandle(200)}
    with pytest.raises(ApiError) as e:
        _run(handles, _part("/v1/rerank", deadline_in=-0.01))
    assert e.value.status == 504 and e.value.kind == "deadline_exceeded"
    assert handles["short"].calls == [] and handles["long"].calls == []


def test_a_dead_replica_is_retried_within_the_deadline_only() -> None:
    handles = {"short": StubHandle(200, dies=1), "long": StubHandle(200)}
    assert _run(handles, _part("/v2/embed", deadline_in=20.0)).pool == "short"
    assert len(handles["short"].calls) == 2  # Serve's retry goes to a live replica
    # The replica dies after the deadline passed: neither retried nor sent to the next pool.
    handles = {"short": StubHandle(200, dies=1), "long": StubHandle(200)}
    handles["short"].delay = 0.2
    with pytest.raises(ApiError) as e:
        _run(handles, _part("/v2/embed", deadline_in=0.1))
    assert e.value.status == 504 and e.value.kind == "deadline_exceeded"
    assert len(handles["short"].calls) == 1 and handles["long"].calls == []


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v2/embed", "/v1/rerank"])
def test_a_deadline_503_is_not_retried_on_the_next_pool(path: str) -> None:
    handles = {"short": StubHandle(503, "deadline_exceeded"), "long": StubHandle(200)}
    with pytest.raises(ApiError) as e:
        _run(handles, _part(path, deadline_in=20.0))
    assert e.value.status == 504 and e.value.kind == "deadline_exceeded"
    assert "pool 'short': waited too long" in e.value.message and "not retried" in e.value.message
    assert len(handles["short"].calls) == 1 and handles["long"].calls == []


@pytest.mark.parametrize(("told", "relayed"), [("600", "60"), ("7", "7"), ("soon", "1")])
def test_a_pools_retry_after_is_relayed_capped_below_the_keep_alive(told: str, relayed: str) -> None:
    handles = {"short": StubHandle(429, "rate_limit_error"), "long": StubHandle(503)}
    handles["short"].retry_after = handles["long"].retry_after = told
    with pytest.raises(ApiError) as e:
        _run(handles, _part())
    assert e.value.status == 429 and e.value.headers["Retry-After"] == relayed


def test_another_503_falls_back() -> None:
    handles = {"short": StubHandle(503), "long": StubHandle(200)}
    assert _run(handles, _part("/v1/rerank")).pool == "long" and len(handles["short"].calls) == 1


def test_a_replica_of_another_schema_is_refused_whatever_its_body_says() -> None:
    handles = {"short": StubHandle(200), "long": StubHandle(200)}
    handles["short"].schema = "es1-other-weights"
    with pytest.raises(ApiError) as e:
        _run(handles, _part())  # the body says SCHEMA: the replica's own schema decides
    assert e.value.status == 502 and "another embedding schema" in e.value.message


def test_a_200_without_one_answer_per_input_is_502() -> None:
    handles = {"short": StubHandle(200), "long": StubHandle(200)}
    part = Part(("short",), [0, 1], 4, {"texts": ["x", "y"]}, "/v2/embed")  # one vector per type
    with pytest.raises(ApiError) as e:
        _run(handles, part)
    assert e.value.status == 502 and "one answer per input" in e.value.message


def test_a_pools_allowance_is_shared_by_tenants_weights_as_the_gateway_shares_it() -> None:
    """Capacity 3 tokens, parts of 3: one at a time. Tenant a (weight 3) and b (weight 1) queue
    8 batch parts each behind a running part: of the first 8 to go, a gets 6, b 2; an online
    part never waits at the gate."""
    handles = {"short": StubHandle(200)}
    handles["short"].delay = 0.01
    gate = FairGate(3)
    runner = _runner(handles, {"short": gate})
    order: list[str] = []

    async def one(tenant: str, weight: float) -> None:
        CURRENT_TENANT.set((tenant, weight))
        await runner.run(Part(("short",), [0], 3, {"input": [tenant]}, "/v1/embeddings"), "batch")
        order.append(tenant)

    async def main() -> float:
        first = asyncio.create_task(one("first", 1.0))
        await asyncio.sleep(0)  # it holds the allowance: everyone else waits
        tasks = [asyncio.create_task(one(t, w)) for _ in range(8) for t, w in (("a", 3.0), ("b", 1.0))]
        await asyncio.sleep(0)
        assert gate.waiting == 16
        began = time.monotonic()
        await runner.run(Part(("short",), [0], 3, {"input": ["q"]}, "/v1/embeddings"), "online")
        online = time.monotonic() - began
        await asyncio.gather(first, *tasks)
        return online

    online = asyncio.run(main())
    assert order[0] == "first" and sorted(order[1:9]) == ["a"] * 6 + ["b"] * 2, order
    assert online < 0.1 and gate.inflight == 0 and gate.waiting == 0
