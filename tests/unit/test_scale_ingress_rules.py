"""The Ray Serve ingress's part runner (scale/ingress.py) with stub deployment handles: a pool's
deadline 503 ends the part with 504 (not re-queued on the next pool, as the HTTP gateway), any
other 503 falls back, and the routes it cannot run are a clear 501."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from embedserve.api.protocol import ApiError
from embedserve.gateway.forward import Part
from embedserve.gateway.metrics import GatewayMetrics

pytest.importorskip("ray")
from embedserve.scale.ingress import ServeRunner


class StubHandle:
    def __init__(self, status: int, error_type: str = "service_unavailable") -> None:
        self.calls = 0
        self.reply: dict[str, Any] = {"status": status, "headers": {"Retry-After": "2"}}
        if status == 200:
            data = [{"object": "embedding", "index": 0, "embedding": [1.0], "num_tokens": 2}]
            self.reply["body"] = {"data": data, "usage": {"prompt_tokens": 2, "total_tokens": 2}}
        else:
            self.reply["body"] = {"error": {"message": "waited too long", "type": error_type}}
        self.embed = SimpleNamespace(remote=self._remote)

    async def _remote(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return self.reply


def _run(handles: dict[str, StubHandle], part: Part) -> Any:
    pools = SimpleNamespace(handles=handles, schema=None)
    runner = ServeRunner(pools, GatewayMetrics(None))  # type: ignore[arg-type]
    return asyncio.run(runner.run(part, "online"))


PART = Part(("short", "long"), [0], 2, {"input": ["x"]})


def test_a_deadline_503_is_not_retried_on_the_next_pool() -> None:
    handles = {"short": StubHandle(503, "deadline_exceeded"), "long": StubHandle(200)}
    with pytest.raises(ApiError) as e:
        _run(handles, PART)
    assert e.value.status == 504 and e.value.kind == "deadline_exceeded"
    assert handles["long"].calls == 0


def test_another_503_falls_back() -> None:
    handles = {"short": StubHandle(503), "long": StubHandle(200)}
    assert _run(handles, PART).pool == "long" and handles["short"].calls == 1


def test_routes_other_than_embeddings_are_501() -> None:
    handles = {"short": StubHandle(200), "long": StubHandle(200)}
    with pytest.raises(ApiError) as e:
        _run(handles, Part(("short",), [0], 2, {"texts": ["x"]}, "/v2/embed"))
    assert e.value.status == 501 and "embedserve gateway" in e.value.message
    assert handles["short"].calls == 0
