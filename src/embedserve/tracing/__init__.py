"""OpenTelemetry traces of the server and the gateway: the settings, read from their flags and
the standard environment, and `start`. Off unless an OTLP traces endpoint is given; this module
imports nothing from OpenTelemetry, so with tracing off none of it is loaded (the `[otel]` extra
need not even be installed) and the serving path pays one `is None` check per request.

    --otlp-traces-endpoint URL        else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else tracing off
    --otlp-traces-protocol PROTOCOL   else $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
                                      else $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc

`OTEL_EXPORTER_OTLP_ENDPOINT` alone does not turn tracing on (it is often set for another
signal); `OTEL_SDK_DISABLED=true` turns it off whatever else is set. The exporters read the rest
of `OTEL_EXPORTER_OTLP_*` (headers, certificates, compression, timeout), the batch processor
`OTEL_BSP_*`, the resource `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`. A tracer
(`Tracing.start`) and its spans: tracing/otel.py, imported only when tracing is on; docs/tracing.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedserve.errors import SettingsError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

PROTOCOLS = ("grpc", "http/protobuf")
SERVER_SERVICE = "embedserve-server"
GATEWAY_SERVICE = "embedserve-gateway"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


@dataclass(frozen=True)
class TraceSettings:
    """Where spans go: an OTLP endpoint over `protocol`, or `exporter` (tests: an in-memory one)."""

    endpoint: str | None = None
    protocol: str = "grpc"
    exporter: SpanExporter | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise SettingsError(_bad_protocol(self.protocol))
        if self.endpoint is None and self.exporter is None:
            raise SettingsError("tracing needs an OTLP traces endpoint (or an exporter)")


def _bad_protocol(value: str) -> str:
    return f"OTLP traces protocol {value!r} is not one of {', '.join(PROTOCOLS)}"


def protocol_argument(value: str) -> str:
    """argparse type of --otlp-traces-protocol: a bad value is refused naming the choices."""
    if value not in PROTOCOLS:
        raise argparse.ArgumentTypeError(_bad_protocol(value))
    return value


def add_tracing_options(parser: Any) -> None:
    """--otlp-traces-endpoint / --otlp-traces-protocol on a parser or argument group."""
    parser.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        metavar="URL",
        help=f"export OpenTelemetry traces over OTLP to URL (default: ${ENDPOINT_ENV}, else no tracing); "
        "gRPC e.g. http://collector:4317, HTTP e.g. http://collector:4318 (/v1/traces added when the URL "
        "has no path); the other OTEL_EXPORTER_OTLP_* variables apply; needs the [otel] extra",
    )
    parser.add_argument(
        "--otlp-traces-protocol",
        type=protocol_argument,
        default=None,
        metavar="|".join(PROTOCOLS),
        help=f"OTLP transport (default: ${PROTOCOL_ENVS[0]}, else ${PROTOCOL_ENVS[1]}, else grpc)",
    )


def trace_settings(
    endpoint: str | None, protocol: str | None, environ: Mapping[str, str] = os.environ
) -> TraceSettings | None:
    """The flags' values over the standard environment; None: tracing off. A bad protocol
    (flag or variable) raises SettingsError naming where it came from."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = endpoint or environ.get(ENDPOINT_ENV) or None
    if endpoint is None:
        return None
    if protocol is None:
        for name in PROTOCOL_ENVS:
            if environ.get(name):
                protocol = environ[name].strip()
                if protocol not in PROTOCOLS:
                    raise SettingsError(f"${name}: {_bad_protocol(protocol)}")
                break
    protocol = protocol or "grpc"
    package = "opentelemetry.exporter.otlp.proto." + ("grpc" if protocol == "grpc" else "http")
    if not _installed(package):
        raise SettingsError(f"tracing over {protocol} needs {package}: pip install 'embedserve[otel]'")
    return TraceSettings(endpoint, protocol)


def _installed(module: str) -> bool:
    """Whether `module` is installed (its parent packages are imported to look: tracing is on)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def from_args(args: argparse.Namespace) -> TraceSettings | None:
    return trace_settings(args.otlp_traces_endpoint, args.otlp_traces_protocol)
