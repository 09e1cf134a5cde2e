"""Tracing's settings and export (tracing/): flags over the standard OTEL_* environment, bad
protocols refused naming the choices (flag or variable), spans reaching an OTLP collector over
gRPC and HTTP/protobuf, the service name, exporters that start and stop without a collector."""

from __future__ import annotations

import http.server
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from embedserve.cli import build_parser, main
from embedserve.errors import SettingsError
from embedserve.tracing import GATEWAY_SERVICE, SERVER_SERVICE, TraceSettings, trace_settings
from embedserve.tracing.otel import Tracing, http_traces_url

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("tool", [["serve", "--model", "m"], ["gateway", "--config", "pools.yaml"]])
def test_a_bad_protocol_is_refused_naming_the_choices(
    tool: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*tool, "--otlp-traces-protocol", "http/json"])
    assert e.value.code == 2
    assert "'http/json' is not one of grpc, http/protobuf" in capsys.readouterr().err


def test_a_bad_protocol_from_the_environment_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
    assert main(["serve", "--model", "/nonexistent"]) == 2
    assert "$OTEL_EXPORTER_OTLP_PROTOCOL: OTLP traces protocol 'thrift'" in capsys.readouterr().err
    assert main(["gateway", "--config", "/nonexistent.yaml"]) == 2
    assert "$OTEL_EXPORTER_OTLP_PROTOCOL" in capsys.readouterr().err


def test_settings_from_flags_and_the_standard_environment() -> None:
    endpoint = "http://collector:4317"
    assert trace_settings(None, None, {}) is None  # off by default
    assert trace_settings(None, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}) is None  # not alone
    assert trace_settings(endpoint, None, {}) == TraceSettings(endpoint, "grpc")
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert trace_settings(None, None, env) == TraceSettings(endpoint, "http/protobuf")
    env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "grpc"  # the traces' own variable first
    assert trace_settings(None, None, env) == TraceSettings(endpoint, "grpc")
    assert trace_settings("http://other:4318", "http/protobuf", env) == TraceSettings(
        "http://other:4318", "http/protobuf"
    )  # flags over the environment
    assert trace_settings(endpoint, None, {"OTEL_SDK_DISABLED": "true"}) is None
    with pytest.raises(SettingsError, match="needs an OTLP traces endpoint"):
        TraceSettings()
    assert http_traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert http_traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"


class _Receiver:
    """An OTLP collector on loopback over either protocol, keeping the span names it got."""

    def __init__(self, protocol: str) -> None:
        self.names: list[str] = []
        self.services: set[str] = set()
        if protocol == "grpc":
            import grpc
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

            receiver = self

            class Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
                def Export(self, request: Any, context: Any) -> Any:
                    receiver.got(request)
                    return trace_service_pb2.ExportTraceServiceResponse()

            self.server = grpc.server(ThreadPoolExecutor(2))
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
            port = self.server.add_insecure_port("127.0.0.1:0")
            self.server.start()
            self.url, self.close = f"http://127.0.0.1:{port}", lambda: self.server.stop(None)
        else:
            receiver = self

            class Handler(http.server.BaseHTTPRequestHandler):
                def do_POST(self) -> None:
                    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                        ExportTraceServiceRequest,
                    )

                    body = self.rfile.read(int(self.headers["content-length"]))
                    assert self.path == "/v1/traces"  # added to the bare endpoint
                    receiver.got(ExportTraceServiceRequest.FromString(body))
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()

                def log_message(self, *args: Any) -> None:
                    pass

            httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            self.url, self.close = f"http://127.0.0.1:{httpd.server_address[1]}", httpd.shutdown

    def got(self, request: Any) -> None:
        for rs in request.resource_spans:
            self.services |= {a.value.string_value for a in rs.resource.attributes if a.key == "service.name"}
            self.names += [s.name for ss in rs.scope_spans for s in ss.spans]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_reach_an_otlp_collector(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_HEADERS"):
        monkeypatch.delenv(name, raising=False)
    receiver = _Receiver(protocol)
    try:
        tracing = Tracing.start(TraceSettings(receiver.url, protocol), GATEWAY_SERVICE)
        with tracing.request("rerank", "/v1/rerank", {"traceparent": TRACEPARENT}, {}) as trace:
            trace.counted("qwen3", [3, 4])
        tracing.shutdown()  # exports what is queued
    finally:
        receiver.close()
    assert receiver.names == ["POST /v1/rerank"] and receiver.services == {GATEWAY_SERVICE}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_exporters_start_and_stop_without_a_collector(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    tracing = Tracing.start(TraceSettings("http://127.0.0.1:9", protocol), SERVER_SERVICE)
    assert tracing.provider.resource.attributes["service.name"] == SERVER_SERVICE
    tracing.shutdown()  # nothing queued: returns at once
    monkeypatch.setenv("OTEL_SERVICE_NAME", "embeddings-eu")
    named = Tracing.start(TraceSettings("http://127.0.0.1:9", protocol), SERVER_SERVICE)
    assert named.provider.resource.attributes["service.name"] == "embeddings-eu"
    named.shutdown()
