"""What OpenTelemetry tracing costs a short request (issue #50): one in-process server (FastAPI's
TestClient; the default model all-MiniLM-L6-v2, or --model), optionally behind an in-process
gateway (--gateway: its pools are that server over httpx's ASGI transport), whose tracers are
switched on and off every other request of a sequential stream (both modes see the same load on
a shared machine), over --rounds. Per mode and round: p50 latency as the client sees it and the
process's CPU-ms per request (all threads; the export thread's work lands on whichever request
runs meanwhile); then the medians over rounds, on - off, and the tracing work alone, per
request, measured without requests: µs on the serving thread and on the export thread.

    python benchmarks/tracing_cost.py --rounds 10 --requests 200 [--gateway] \
        [--sink memory | otlp-http | otlp-grpc] [--endpoint URL]

Sinks: `memory` (InMemorySpanExporter, cleared after each block); `otlp-http` (default): a
dummy OTLP/HTTP collector on loopback in this process that answers 200 (its CPU counts here
too); `otlp-grpc`: OTLP/gRPC to --endpoint (default: a loopback port nothing listens on, so
exports fail off-thread and are dropped, as with a collector that is down).
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import statistics
import threading
import time
from typing import Any

import httpx
import numpy as np
from fastapi.testclient import TestClient

from embedserve.engine.outputs import EmbeddingOutput
from embedserve.gateway.app import create_app as create_gateway_app
from embedserve.gateway.live import Live
from embedserve.gateway.pools.config import parse_config
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import Forwarder
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.upstreams import UpstreamSet
from embedserve.gateway.service import GatewayService
from embedserve.models.default import default_model_path
from embedserve.server.app import create_app
from embedserve.server.runtime import ServerSettings
from embedserve.tracing import GATEWAY_SERVICE, SERVER_SERVICE, TraceSettings
from embedserve.tracing.otel import Tracing

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]


def texts(n: int, words: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)) + f" {i}" for i in range(n)]


class _Collector(http.server.BaseHTTPRequestHandler):
    exports = 0  # export requests received (a check that spans went out)
    received = 0  # bytes

    def do_POST(self) -> None:
        _Collector.exports += 1
        _Collector.received += len(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def dummy_collector() -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1/traces"


def settings(sink: str, endpoint: str | None) -> TraceSettings:
    if sink == "memory":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        return TraceSettings(exporter=InMemorySpanExporter())
    if sink == "otlp-http":
        return TraceSettings(endpoint or dummy_collector(), "http/protobuf")
    return TraceSettings(endpoint or "http://127.0.0.1:9", "grpc")


def gateway_client(server: TestClient, model: str, tracing: Tracing) -> tuple[TestClient, GatewayService]:
    cfg = parse_config(
        {
            "pools": {"all": {"max_tokens": 256, "upstreams": ["http://pool:1"]}},
            "routes": [{"class": "online", "order": ["all"]}],
        }
    )
    upstreams = UpstreamSet(cfg, httpx.AsyncClient(transport=httpx.ASGITransport(app=server.app)))

    async def poll_once() -> None:
        await upstreams.start()
        await upstreams.close()

    asyncio.run(poll_once())
    metrics = GatewayMetrics(upstreams)
    forwarder = Forwarder(upstreams, metrics, cfg.balance, tracing)
    service = GatewayService(cfg, TokenCounter(model), upstreams, metrics, forwarder, tracing)
    return TestClient(create_gateway_app(Live.of(service))), service


def requests(
    client: TestClient, inputs: list[str], switch: Any, first_on: bool
) -> dict[bool, list[tuple[float, float]]]:
    """Sequential requests, tracing switched on and off every request (so that both modes see
    the same load on a shared machine): {on: [(latency, process CPU) in s]}."""
    seen: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i, text in enumerate(inputs):
        on = (i % 2 == 0) == first_on
        switch(on)
        cpu, start = time.process_time(), time.perf_counter()
        r = client.post("/v1/embeddings", json={"input": text})
        seen[on].append((time.perf_counter() - start, time.process_time() - cpu))
        assert r.status_code == 200, r.text
    return seen


def span_work(n: int = 400, repeats: int = 5) -> tuple[float, float, float]:
    """The tracing work of one request alone, without requests (µs, medians of `repeats` runs of
    `n`, within the batch processor's queue of 2,048 spans): a server request's on the serving
    thread (request span with an extracted traceparent, its four children, the end), a gateway
    request's (request span, one upstream CLIENT span with traceparent injected), and the export
    thread's per server request (OTLP/HTTP encoding and a POST to the dummy collector)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    out = [EmbeddingOutput(np.zeros(4, np.float32), 16, False, 0.001, 0.005, 0, 1, 0, time.monotonic())]
    exporter = OTLPSpanExporter(endpoint=dummy_collector())
    server, gateway, export = [], [], []
    for _ in range(repeats):
        memory = InMemorySpanExporter()
        tracing = Tracing.start(TraceSettings(exporter=memory), SERVER_SERVICE)
        start = time.perf_counter()
        for _ in range(n):
            with tracing.request("embeddings", "/v1/embeddings", headers, {}) as trace:
                t = time.perf_counter()
                trace.answered(out, 16, t - 0.01, 0.001, 0.008, "model", "online")
                trace.responded(200)
        server.append((time.perf_counter() - start) / n * 1e6)
        tracing.flush()
        spans = memory.get_finished_spans()
        start = time.perf_counter()
        for i in range(0, len(spans), 512):  # the batch processor's default batch size
            exporter.export(spans[i : i + 512])
        export.append((time.perf_counter() - start) / len(spans) * 5 * 1e6)
        start = time.perf_counter()
        for _ in range(n // 2):
            with tracing.request(
                "embeddings", "/v1/embeddings", headers, {"embedserve.priority": "online"}
            ) as g:
                g.counted("model", [16])
                with tracing.upstream("http://pool:1/v1/embeddings", "short", 1, 16, {}) as call:
                    call.status = 200
                g.set({"embedserve.pools": "short"})
        gateway.append((time.perf_counter() - start) / (n // 2) * 1e6)
        tracing.shutdown()
    return statistics.median(server), statistics.median(gateway), statistics.median(export)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--requests", type=int, default=200, help="requests per mode and round")
    p.add_argument("--words", type=int, default=12, help="words per input (short queries)")
    p.add_argument("--gateway", action="store_true", help="through an in-process gateway (its spans too)")
    p.add_argument("--sink", choices=["memory", "otlp-http", "otlp-grpc"], default="otlp-http")
    p.add_argument("--endpoint", default=None, help="OTLP endpoint for the otlp sinks")
    args = p.parse_args()
    model = args.model or str(default_model_path())
    trace = settings(args.sink, args.endpoint)
    server_tracing = Tracing.start(trace, SERVER_SERVICE)
    gateway_tracing = Tracing.start(trace, GATEWAY_SERVICE)
    with TestClient(create_app(ServerSettings(model=model, warmup_lengths=(16,)))) as server:
        while server.get("/health/ready").status_code != 200:
            time.sleep(0.05)
        service = server.app.state.runtime.service  # type: ignore[attr-defined]
        client, gateway = (server, None)
        if args.gateway:
            client, gateway = gateway_client(server, model, gateway_tracing)

        def switch(on: bool) -> None:
            service.tracing = server_tracing if on else None
            if gateway is not None:
                gateway.tracing = gateway.forwarder.tracing = gateway_tracing if on else None

        requests(client, texts(100, args.words), switch, True)  # warm both paths
        p50: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            seen = requests(client, texts(2 * args.requests, args.words), switch, r % 2 == 0)
            for on, pairs in seen.items():
                p50[on].append(statistics.median(lat for lat, _ in pairs) * 1e3)
                cpu[on].append(statistics.mean(c for _, c in pairs) * 1e3)
            print(f"round {r}: p50 ms off {p50[False][-1]:.3f} on {p50[True][-1]:.3f}  "
                  f"CPU ms/request off {cpu[False][-1]:.3f} on {cpu[True][-1]:.3f}")  # fmt: skip
            if args.sink == "memory":
                server_tracing.flush()
                trace.exporter.clear()
        server_tracing.shutdown()
        gateway_tracing.shutdown()
    p50_off, p50_on = statistics.median(p50[False]), statistics.median(p50[True])
    cpu_off, cpu_on = statistics.median(cpu[False]), statistics.median(cpu[True])
    diffs = [b - a for a, b in zip(p50[False], p50[True], strict=True)]
    where = "gateway -> server" if args.gateway else "server"
    print(f"{where}, sink {args.sink}, {args.rounds} rounds x {args.requests} requests per mode, interleaved")
    added = p50_on - p50_off
    print(f"p50 ms  off {p50_off:.3f}  on {p50_on:.3f}  on - off {added:+.3f} (median of round differences "
          f"{statistics.median(diffs):+.3f})")  # fmt: skip
    print(f"CPU ms/request  off {cpu_off:.3f}  on {cpu_on:.3f}  on - off {cpu_on - cpu_off:+.3f}")
    server_us, gateway_us, export_us = span_work()
    print(f"tracing work per request alone, µs: server {server_us:.1f}, gateway {gateway_us:.1f} (serving "
          f"thread); export thread {export_us:.1f} per server request")  # fmt: skip
    if _Collector.exports:
        print(f"dummy collector: {_Collector.exports} export requests, {_Collector.received} bytes")


if __name__ == "__main__":
    main()
