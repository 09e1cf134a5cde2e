"""OpenTelemetry traces (tracing/): one trace from a client's traceparent through the gateway's
request span and its upstream CLIENT spans to each pool server's request span and that span's
tokenize / queue / engine / serialize children; attributes by the gen_ai conventions and no
input text; what the engine's outputs record for them; with tracing off no OpenTelemetry module
is imported. Settings and export: test_tracing_export.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from embedserve.engine.engine import Engine
from embedserve.tracing import GATEWAY_SERVICE, SERVER_SERVICE, TraceSettings
from embedserve.tracing.otel import Tracing
from tests.helpers.engine_calls import embed_outputs
from tests.helpers.inprocess import gateway_app, runtime_of, server_client
from tests.helpers.reference import random_ids
from tests.helpers.server_process import words

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
SHORT, LONG = words(4, seed=7), words(200, seed=8)  # the short pool's and the long pool's


@pytest.fixture(scope="module")
def exporters() -> tuple[InMemorySpanExporter, InMemorySpanExporter]:
    return InMemorySpanExporter(), InMemorySpanExporter()  # (server's, gateway's)


@pytest.fixture(scope="module")
def server(qwen3_dir: Path, exporters: tuple[InMemorySpanExporter, Any]) -> Iterator[TestClient]:
    with server_client(qwen3_dir, tracing=TraceSettings(exporter=exporters[0])) as c:
        yield c


@pytest.fixture(scope="module")
def gateway_tracing(exporters: tuple[Any, InMemorySpanExporter]) -> Iterator[Tracing]:
    tracing = Tracing.start(TraceSettings(exporter=exporters[1]), GATEWAY_SERVICE)
    yield tracing
    tracing.shutdown()


@pytest.fixture(scope="module")
def gateway(server: TestClient, qwen3_dir: Path, gateway_tracing: Tracing) -> TestClient:
    return TestClient(gateway_app(server.app, qwen3_dir, tracing=gateway_tracing))


def spans(server: TestClient, gateway_tracing: Tracing, exporters: Any) -> list[ReadableSpan]:
    """Every span both exported since the last call (their batch processors flushed)."""
    server_tracing = runtime_of(server).tracing
    assert server_tracing is not None
    server_tracing.flush()
    gateway_tracing.flush()
    found = [*exporters[0].get_finished_spans(), *exporters[1].get_finished_spans()]
    for e in exporters:
        e.clear()
    return found


def hex_id(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else hex_id(span.parent.span_id, 16)


def span_id(span: ReadableSpan) -> str:
    return hex_id(span.context.span_id, 16)


def test_one_trace_from_the_gateway_through_each_pool_to_the_engine(
    gateway: TestClient, server: TestClient, gateway_tracing: Tracing, exporters: Any
) -> None:
    spans(server, gateway_tracing, exporters)  # the warm-up's and earlier tests' spans
    body = {"input": [SHORT, LONG], "model": "qwen3"}
    resp = gateway.post("/v1/embeddings", json=body, headers={"traceparent": TRACEPARENT})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-embedserve-pools"] == "short,long"
    found = spans(server, gateway_tracing, exporters)
    assert {hex_id(s.context.trace_id, 32) for s in found} == {TRACE_ID}  # one trace, the client's

    (root,) = [
        s
        for s in found
        if s.resource.attributes["service.name"] == GATEWAY_SERVICE and s.kind is SpanKind.SERVER
    ]
    assert root.name == "POST /v1/embeddings" and parent_of(root) == CLIENT_SPAN
    tokens = resp.json()["usage"]["prompt_tokens"]
    attrs = dict(root.attributes or {})
    assert attrs["gen_ai.operation.name"] == "embeddings" and attrs["gen_ai.request.model"] == "qwen3"
    assert attrs["gen_ai.usage.input_tokens"] == tokens and attrs["embedserve.inputs"] == 2
    assert attrs["embedserve.priority"] == "online" and attrs["embedserve.pools"] == "short,long"
    assert attrs["http.response.status_code"] == 200

    calls = {s.attributes["embedserve.pool"]: s for s in found if s.kind is SpanKind.CLIENT}  # type: ignore[index]
    assert sorted(calls) == ["long", "short"]
    for call in calls.values():
        assert call.name == "POST /v1/embeddings" and parent_of(call) == span_id(root)
        assert call.attributes is not None and call.attributes["http.response.status_code"] == 200
        assert call.attributes["embedserve.inputs"] == 1
        # the pool's server span is the CLIENT span's child: traceparent went along
        (served,) = [s for s in found if s.kind is SpanKind.SERVER and parent_of(s) == span_id(call)]
        assert served.resource.attributes["service.name"] == SERVER_SERVICE
        assert served.name == "POST /v1/embeddings" and served.attributes is not None
        assert served.attributes["gen_ai.operation.name"] == "embeddings"
        assert served.attributes["gen_ai.usage.input_tokens"] == call.attributes["gen_ai.usage.input_tokens"]
        assert served.attributes["embedserve.priority"] == "online"
        check_children(served, [s for s in found if parent_of(s) == span_id(served)])
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in calls.values()) == tokens  # type: ignore[index,misc]
    for s in found:  # no input text is recorded anywhere
        assert not any(
            isinstance(v, str) and (SHORT in v or LONG in v) for v in (s.attributes or {}).values()
        )


def check_children(served: ReadableSpan, children: list[ReadableSpan]) -> None:
    """tokenize, queue, engine, serialize: in order, within the request's span."""
    by_name = {c.name: c for c in children}
    assert sorted(by_name) == ["engine", "queue", "serialize", "tokenize"]
    tokenize, queue, engine, serialize = (by_name[n] for n in ("tokenize", "queue", "engine", "serialize"))
    slack = 2_000_000  # ns: two clocks read a few microseconds apart, rounding
    assert served.start_time is not None and served.end_time is not None
    assert served.start_time - slack <= tokenize.start_time <= tokenize.end_time  # type: ignore[operator]
    assert tokenize.end_time <= queue.start_time + slack  # type: ignore[operator]
    assert queue.end_time <= engine.start_time + slack  # type: ignore[operator]
    assert engine.end_time <= serialize.start_time + slack  # type: ignore[operator]
    assert serialize.end_time <= served.end_time + slack  # type: ignore[operator]
    e = engine.attributes or {}
    assert e["embedserve.engine.steps"] >= 1 and e["embedserve.inputs"] == 1  # type: ignore[operator]
    assert e["embedserve.engine.preemptions"] == 0 and e["embedserve.engine.lane_slices"] == 0


def test_a_server_request_is_the_child_of_the_callers_traceparent(
    server: TestClient, gateway_tracing: Tracing, exporters: Any
) -> None:
    spans(server, gateway_tracing, exporters)
    resp = server.post("/v1/embeddings", json={"input": SHORT}, headers={"traceparent": TRACEPARENT})
    assert resp.status_code == 200
    (served,) = [s for s in spans(server, gateway_tracing, exporters) if s.kind is SpanKind.SERVER]
    assert hex_id(served.context.trace_id, 32) == TRACE_ID and parent_of(served) == CLIENT_SPAN
    assert served.attributes is not None and served.attributes["gen_ai.request.model"] == "qwen3"

    # no traceparent: a trace of its own; a refusal still ends its span, with its status
    resp = server.post("/v1/embeddings", json={"input": SHORT, "model": "other"})
    assert resp.status_code == 404
    (refused,) = spans(server, gateway_tracing, exporters)
    assert refused.parent is None and refused.attributes is not None
    assert refused.attributes["http.response.status_code"] == 404


def test_outputs_record_their_steps_lane_slices_and_finish_time(qwen3_dir: Path) -> None:
    """What the engine span reads: steps that ran a chunk (a 90-token prompt in 64-token
    steps: 2), layer-major lane slices (a 300-token prompt over the 100-token threshold)."""
    seqs = [random_ids(n, seed=n) for n in (5, 90, 300)]
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=64, layer_major_tokens=100) as engine:
        before = time.monotonic()
        outputs = embed_outputs(engine, seqs)
        after = time.monotonic()
    assert [(o.num_steps, o.num_lane_slices > 0) for o in outputs] == [(1, False), (2, False), (0, True)]
    for o in outputs:
        assert before <= o.finish_time - o.inference_time - o.queue_time <= o.finish_time <= after


def test_tracing_off_imports_no_opentelemetry(qwen3_dir: Path) -> None:
    """A server request and the CLIs' settings with tracing off load no OpenTelemetry module
    beyond what FastAPI itself imports (its own telemetry hooks, newer FastAPI only)."""
    script = textwrap.dedent(
        f"""
        import sys
        import fastapi
        from fastapi.testclient import TestClient
        baseline = {{m for m in sys.modules if m.startswith("opentelemetry")}}
        from embedserve.cli import build_parser
        from embedserve.server.app import create_app
        from embedserve.server.cli import _settings
        import embedserve.gateway.app, embedserve.gateway.cli, embedserve.scale.replica
        settings = _settings(build_parser().parse_args(["serve", "--model", {str(qwen3_dir)!r}]))
        assert settings.tracing is None
        with TestClient(create_app(settings)) as c:
            while c.get("/health/ready").status_code != 200:
                pass
            assert c.post("/v1/embeddings", json={{"input": "hello"}}).status_code == 200
        loaded = {{m for m in sys.modules if m.startswith("opentelemetry")}} - baseline
        assert not loaded, sorted(loaded)
        assert "embedserve.tracing.otel" not in sys.modules
        """
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
