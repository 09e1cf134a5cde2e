"""The OpenTelemetry side of tracing (imported only when it is on: tracing/__init__.py): the
provider with its batch processor and OTLP exporter, W3C trace context in and out, and the spans.

    gateway  POST /v1/embeddings            SERVER  (parent: the client's traceparent)
               POST /v1/embeddings          CLIENT  one per upstream call, traceparent sent
    server       POST /v1/embeddings        SERVER  (parent: the gateway's CLIENT span)
                   tokenize, queue, engine, serialize

A server request's children are made after the fact, from timings the serving template keeps
anyway (server/pipeline.py) and the engine's per-request record (engine/outputs.py), so tracing
adds no work between its stages. Attributes follow the gen_ai semantic conventions
(gen_ai.operation.name, gen_ai.request.model, gen_ai.usage.input_tokens) plus embedserve.*; no
input text is ever recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from embedserve.api.protocol import ApiError
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.tracing import TraceSettings

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent / tracestate only
# gen_ai.operation.name per route (api/routes.py); a route not listed is named as it is.
_OPERATIONS = {
    "embeddings": "embeddings",
    "cohere_embed": "embeddings",
    "tei_embed": "embeddings",
    "tei_embed_sparse": "embeddings",
}
AttrValue = str | int | float | bool
Attributes = Mapping[str, AttrValue]


def operation(route_name: str) -> str:
    return _OPERATIONS.get(route_name, route_name)


def extract(headers: Mapping[str, str] | None) -> otel_context.Context | None:
    """The caller's trace context from W3C `traceparent` / `tracestate` headers (None: none)."""
    return None if headers is None else _PROPAGATOR.extract(headers)


def inject(headers: MutableMapping[str, str], span: Span) -> None:
    """`traceparent` (and `tracestate`) of `span` into an outgoing request's headers."""
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))


class Tracing:
    """A tracer of one service (the server's or the gateway's) on its own provider: never the
    global one, which other libraries (FastAPI's own telemetry) would then start using too."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("embedserve")

    @classmethod
    def start(cls, settings: TraceSettings, service_name: str) -> Tracing:
        """A tracer exporting in batches off the serving thread; `service_name` unless
        OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) names the service."""
        exporter = settings.exporter or _exporter(settings)
        provider = TracerProvider(resource=_resource(service_name))
        provider.add_span_processor(BatchSpanProcessor(exporter))  # exports off the serving thread
        return cls(provider)

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        """Export what is left (within the processor's timeout), then stop."""
        self.provider.shutdown()

    @contextlib.contextmanager
    def request(
        self, route_name: str, path: str, headers: Mapping[str, str] | None, attributes: Attributes
    ) -> Iterator[RequestSpan]:
        """One request's SERVER span, child of the caller's traceparent, current while it runs
        (an upstream call's CLIENT span finds it so); its status from the ApiError or Response."""
        attrs: dict[str, AttrValue] = {
            "http.request.method": "POST",
            "http.route": path,
            "gen_ai.operation.name": operation(route_name),
            **attributes,
        }
        span = self.tracer.start_span(
            f"POST {path}", context=extract(headers), kind=SpanKind.SERVER, attributes=attrs
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        rs = RequestSpan(self.tracer, span)
        try:
            yield rs
        except ApiError as e:
            rs.status = e.status
            raise
        except asyncio.CancelledError:
            rs.status = None
            span.set_attribute("error.type", "cancelled")
            raise
        except Exception as e:
            rs.status = 500
            span.record_exception(e)
            raise
        finally:
            otel_context.detach(token)
            rs.end(server=True)

    @contextlib.contextmanager
    def upstream(
        self, url: str, pool: str, inputs: int, tokens: int, headers: MutableMapping[str, str]
    ) -> Iterator[RequestSpan]:
        """One upstream call's CLIENT span (child of the current request span); its
        `traceparent` goes into `headers`. Set `status` from the answer."""
        parts = urlsplit(url)
        attrs: dict[str, AttrValue] = {
            "http.request.method": "POST",
            "url.full": url,
            "server.address": parts.hostname or "",
            "embedserve.pool": pool,
            "embedserve.inputs": inputs,
            "gen_ai.usage.input_tokens": tokens,
        }
        if parts.port is not None:
            attrs["server.port"] = parts.port
        span = self.tracer.start_span(f"POST {parts.path}", kind=SpanKind.CLIENT, attributes=attrs)
        inject(headers, span)
        call = RequestSpan(self.tracer, span)
        try:
            yield call
        except BaseException as e:
            call.status = None
            span.set_attribute("error.type", type(e).__name__)
            span.set_status(Status(StatusCode.ERROR, str(e)[:200]))
            raise
        finally:
            call.end(server=False)


class RequestSpan:
    """A live span and what its end records: the HTTP status (None: no answer), and for a
    server request the children made after the fact (`answered`, `responded`)."""

    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self.tracer = tracer
        self.span = span
        self.status: int | None = 200
        self._serialize_start: int | None = None  # ns since the epoch

    def set(self, attributes: Attributes) -> None:
        self.span.set_attributes(attributes)

    def counted(self, model: str, counts: Sequence[int]) -> None:
        """A gateway request's model and token counts."""
        tokens = sum(counts)
        self.set(
            {
                "gen_ai.request.model": model,
                "gen_ai.usage.input_tokens": tokens,
                "embedserve.inputs": len(counts),
            }
        )

    def answered(
        self,
        outputs: Sequence[EmbeddingOutput],
        n_tokens: int,
        start: float,
        tokenize_time: float,
        total: float,
        model: str,
        priority: str,
    ) -> None:
        """A server request's tokenize / queue / engine children, from the serving template's
        timings (`start`: its time.perf_counter(); durations in seconds) and the outputs'."""
        clock = _Clock()
        begin = clock.perf(start)
        self.set(
            {
                "gen_ai.request.model": model,
                "gen_ai.usage.input_tokens": n_tokens,
                "embedserve.inputs": len(outputs),
                "embedserve.priority": priority,
            }
        )
        tokens: Attributes = {"gen_ai.usage.input_tokens": n_tokens}
        self._child("tokenize", begin, clock.perf(start + tokenize_time), tokens)
        if outputs:  # a route may answer without engine work
            first = [o.finish_time - o.inference_time for o in outputs]  # first scheduled
            arrival = min(f - o.queue_time for f, o in zip(first, outputs, strict=True))
            inputs: Attributes = {"embedserve.inputs": len(outputs)}
            self._child("queue", clock.mono(arrival), clock.mono(max(first)), inputs)
            engine: dict[str, AttrValue] = {
                "embedserve.inputs": len(outputs),
                "embedserve.engine.steps": sum(o.num_steps for o in outputs),
                "embedserve.engine.lane_slices": sum(o.num_lane_slices for o in outputs),
                "embedserve.engine.preemptions": sum(o.num_preemptions for o in outputs),
            }
            end = clock.mono(max(o.finish_time for o in outputs))
            self._child("engine", clock.mono(min(first)), end, engine)
        self._serialize_start = clock.perf(start + total)

    def responded(self, status: int) -> None:
        """The response is built (its body serialized): the serialize child ends now."""
        self.status = status
        if self._serialize_start is not None:
            self._child("serialize", self._serialize_start, time.time_ns(), {})
            self._serialize_start = None

    def _child(self, name: str, start_ns: int, end_ns: int, attributes: Attributes) -> None:
        ctx = trace.set_span_in_context(self.span)
        span = self.tracer.start_span(name, context=ctx, attributes=attributes, start_time=start_ns)
        span.end(end_time=max(end_ns, start_ns))

    def end(self, server: bool) -> None:
        """Server spans are errors from 500 up (a 4xx is the caller's), client spans from 400."""
        span = self.span
        if self.status is not None:
            span.set_attribute("http.response.status_code", self.status)
            if self.status >= (500 if server else 400):
                span.set_attribute("error.type", str(self.status))
                span.set_status(Status(StatusCode.ERROR))
        span.end()


class _Clock:
    """time.perf_counter() and time.monotonic() readings as ns since the epoch (spans' clock)."""

    def __init__(self) -> None:
        now = time.time_ns()
        self._perf = now - time.perf_counter_ns()
        self._mono = now - time.monotonic_ns()

    def perf(self, seconds: float) -> int:
        return self._perf + int(seconds * 1e9)

    def mono(self, seconds: float) -> int:
        return self._mono + int(seconds * 1e9)


def _resource(service_name: str) -> Resource:
    """The environment's resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME), named
    `service_name` where neither names the service."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    return resource


def _exporter(settings: TraceSettings) -> SpanExporter:
    endpoint = settings.endpoint
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=http_traces_url(endpoint) if endpoint else None)


def http_traces_url(endpoint: str) -> str:
    """OTLP/HTTP's traces URL: a collector's base URL gets `/v1/traces`, a path is kept."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return parts._replace(path="/v1/traces").geturl()
    return endpoint
