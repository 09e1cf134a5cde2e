"""`embedserve gateway`: route embeddings requests by token count and traffic class to pools.

Routes POST /v1/embeddings and /v2/embed (each input to the smallest pool that fits it), and
/v1/rerank (+ /rerank, /v2/rerank; a request goes whole to the pool that fits its longest input),
GET /v1/models, /health/live, /health/ready, /metrics; many models and tenants from pools.yaml
(docs/gateway.md); `kill -HUP` reloads it (gateway/live.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from embedserve.api.keepalive import KEEP_ALIVE_S, MAX_RETRY_AFTER_S, UPSTREAM_KEEPALIVE_EXPIRY_S
from embedserve.batch.settings import BatchSettings, add_batch_options
from embedserve.batch.settings import from_args as batch_settings
from embedserve.errors import EmbedServeError
from embedserve.models.default import model_argument
from embedserve.tracing import GATEWAY_SERVICE, TraceSettings, add_tracing_options
from embedserve.tracing import from_args as tracing_settings

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from embedserve.gateway.fleet_config import FleetConfig

log = logging.getLogger(__name__)

API_KEY_ENV = "EMBEDSERVE_GATEWAY_API_KEY"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gateway",
        help="route /v1/embeddings, /v2/embed and /v1/rerank by token count to length pools; online vs "
        "batch classes; schema guard; end-to-end deadline; client API keys",
        description=__doc__,
    )
    p.add_argument(
        "--config",
        required=True,
        help="pools.yaml: pools and routes, or models, aliases, tenants (docs/gateway.md); SIGHUP reloads",
    )
    p.add_argument(
        "--model",
        default=None,
        type=model_argument,
        help="model directory or .gguf file whose tokenizer and prompts count tokens (default: 'model:' "
        "in the config); must be the pools' model",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require 'Authorization: Bearer KEY' from the gateway's clients (repeatable; or "
        f"comma-separated in ${API_KEY_ENV} or in the variable named by the config's api_keys_env); "
        "not the key sent to the pools (upstream_api_key_env); health endpoints stay open",
    )
    p.add_argument(
        "--request-timeout",
        type=_seconds,
        default=None,
        help="end-to-end deadline of a client request in seconds, queueing in the pools included "
        "(default: the config's request_timeout_s, else timeout_s; a client's X-Request-Timeout "
        "may shorten it); passed down as X-Request-Timeout, "
        "answered 504 once passed; a pool's deadline 503 is answered 504 at once, not retried "
        "on another pool",
    )
    p.add_argument(
        "--timeout-keep-alive",
        type=_seconds,
        default=KEEP_ALIVE_S,
        help=f"seconds before an idle client connection is closed (default: {KEEP_ALIVE_S:g}); keep it above "
        f"the clients' own idle expiry (httpx: 5 s) and the longest Retry-After ({MAX_RETRY_AFTER_S} s), "
        "else a request sent as the gateway closes the connection gets no answer. The gateway drops "
        f"its own idle connections to the pools after {UPSTREAM_KEEPALIVE_EXPIRY_S:g} s (below any pool's "
        "keep-alive) and resends a request (at most twice) when a reused pool connection fails "
        "before answering",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to bind (default: 8080)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_tracing_options(p)
    add_batch_options(p, share=False)
    p.set_defaults(func=_cmd_gateway)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from embedserve.gateway.fleet_config import load_fleet

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request at INFO: the health polls alone would drown the gateway's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        trace = tracing_settings(args)

        def adjust(fleet: FleetConfig) -> FleetConfig:
            """The config as this command line runs it (also each reload's)."""
            if args.model is not None and not fleet.single:
                raise EmbedServeError("--model: with a 'models:' map, each model sets its own 'model:'")
            if args.request_timeout is None:
                return fleet
            timeout = fleet.first().timeout_s
            if args.request_timeout > timeout:
                raise EmbedServeError(
                    f"--request-timeout {args.request_timeout:g} is over the config's timeout_s "
                    f"({timeout:g} s, one upstream call)"
                )
            timed = [dataclasses.replace(m, request_timeout_s=args.request_timeout) for m in fleet.models]
            return dataclasses.replace(fleet, models=tuple(timed))

        def counter_for(model: str | None) -> str:
            """The directory a model's tokens are counted with: --model, else its `model:`."""
            if args.model is not None:
                return str(args.model)
            if model is None:
                raise EmbedServeError("no model to count tokens with: pass --model or set 'model:' in config")
            return _resolve_model(model)

        fleet = adjust(load_fleet(args.config))
        keys = client_api_keys(args.api_key, fleet.first().api_keys_env)
        for m in fleet.models:
            counter_for(m.model)  # refused here, before anything starts
        try:
            batch = batch_settings(args)
        except ValueError as e:
            raise EmbedServeError(str(e)) from None
        return asyncio.run(_serve(fleet, counter_for, adjust, keys, args, trace, batch))
    except EmbedServeError as e:
        print(f"embedserve gateway: error: {e}", file=sys.stderr)
        return 2


def _resolve_model(value: str) -> str:
    """`model:` from the config, read like --model (the bundled default model by its name)."""
    try:
        return model_argument(value)
    except argparse.ArgumentTypeError as e:
        raise EmbedServeError(f"model: {e}") from None


def client_api_keys(given: list[str] | None, config_env: str | None) -> tuple[str, ...]:
    """The keys the gateway's clients may send: --api-key, $EMBEDSERVE_GATEWAY_API_KEY and the
    config's api_keys_env variable (comma-separated); never logged."""
    keys = list(given or [])
    keys += os.environ.get(API_KEY_ENV, "").split(",")
    if config_env:
        if not os.environ.get(config_env):
            raise EmbedServeError(f"api_keys_env: ${config_env} is not set")
        keys += os.environ[config_env].split(",")
    return tuple(dict.fromkeys(k.strip() for k in keys if k.strip()))


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return seconds


async def _after(previous: asyncio.Task[None] | None, then: Callable[[], Awaitable[None]]) -> None:
    if previous is not None:
        with contextlib.suppress(Exception):
            await previous
    await then()


async def _serve(
    fleet_config: FleetConfig,
    counter_for: Callable[[str | None], str],
    adjust: Callable[[FleetConfig], FleetConfig],
    keys: tuple[str, ...],
    args: argparse.Namespace,
    trace: TraceSettings | None,
    batch: BatchSettings | None = None,
) -> int:
    import httpx
    import uvicorn

    from embedserve.gateway.app import create_app
    from embedserve.gateway.batch_lines import gateway_batch_jobs
    from embedserve.gateway.live import Built, build, reload

    config = fleet_config.first()  # the keys every model shares
    headers: dict[str, str] = {}
    if config.upstream_api_key_env:
        key = os.environ.get(config.upstream_api_key_env)
        if not key:
            raise EmbedServeError(f"upstream_api_key_env: ${config.upstream_api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    # One pooled client for every upstream: connections are reused across requests, never once
    # a pool may have closed them (api/keepalive.py).
    limits = httpx.Limits(
        max_connections=1024, max_keepalive_connections=256, keepalive_expiry=UPSTREAM_KEEPALIVE_EXPIRY_S
    )
    timeout = httpx.Timeout(config.timeout_s, connect=5.0)
    tracing = None
    if trace is not None:  # OpenTelemetry is imported only then
        from embedserve.tracing.otel import Tracing

        tracing = Tracing.start(trace, GATEWAY_SERVICE)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        built: Built | None = None
        try:
            built = await build(fleet_config, counter_for, client, tracing)
            jobs = None if batch is None else (gateway_batch_jobs(batch, built.live), batch.max_file_bytes)
            app = create_app(built.live, keys, jobs)
            server = uvicorn.Server(uvicorn_config(app, args))
            # uvicorn re-raises SIGTERM / SIGINT (Ctrl-C) after its graceful shutdown; these
            # handlers make that exit 0 (not 143, nor a KeyboardInterrupt into the pools' close)
            signal.signal(signal.SIGTERM, _stopped)
            signal.signal(signal.SIGINT, _stopped)
            reloading: list[asyncio.Task[None]] = []

            async def on_hup() -> None:
                nonlocal built
                assert built is not None
                built = await reload(args.config, adjust, counter_for, client, tracing, built)

            def hup() -> None:  # one reload at a time, in order
                previous = reloading[-1] if reloading else None
                reloading.append(asyncio.ensure_future(_after(previous, on_hup)))

            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hup)
            await server.serve()
        finally:
            for upstreams in built.sets if built is not None else []:
                await upstreams.close()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)  # the spans not yet exported
    return 0


def uvicorn_config(app: FastAPI, args: argparse.Namespace) -> uvicorn.Config:
    """The gateway's uvicorn settings from its command line."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # uvicorn takes whole seconds; never round a keep-alive down to 0.
        timeout_keep_alive=max(1, round(args.timeout_keep_alive)),
    )


def _stopped(signum: int, frame: FrameType | None) -> None:
    log.info("gateway stopped")
