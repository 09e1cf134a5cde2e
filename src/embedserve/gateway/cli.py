"""`embedserve gateway`: route embeddings requests by token count and traffic class to pools."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from embedserve.errors import EmbedServeError
from embedserve.models.default import model_argument

if TYPE_CHECKING:
    from embedserve.gateway.config import GatewayConfig
    from embedserve.gateway.counting import TokenCounter

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gateway",
        help="route /v1/embeddings by token count to length pools; online vs batch classes; schema guard",
        description=__doc__,
    )
    p.add_argument(
        "--config", required=True, help="pools.yaml: pools, routes (see embedserve.gateway.config)"
    )
    p.add_argument(
        "--model",
        default=None,
        type=model_argument,
        help="model directory or .gguf file whose tokenizer and prompts count tokens (default: 'model:' "
        "in the config); must be the pools' model",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to bind (default: 8080)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_gateway)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from embedserve.gateway.config import load_config
    from embedserve.gateway.counting import TokenCounter

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request at INFO: the health polls alone would drown the gateway's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load_config(args.config)
        model = args.model or (_resolve_model(config.model) if config.model else None)
        if model is None:
            raise EmbedServeError("no model to count tokens with: pass --model or set 'model:' in the config")
        counter = TokenCounter(model)
        return asyncio.run(_serve(config, counter, args.host, args.port, args.log_level))
    except EmbedServeError as e:
        print(f"embedserve gateway: error: {e}", file=sys.stderr)
        return 2


def _resolve_model(value: str) -> str:
    """`model:` from the config, read like --model (the bundled default model by its name)."""
    try:
        return model_argument(value)
    except argparse.ArgumentTypeError as e:
        raise EmbedServeError(f"model: {e}") from None


async def _serve(config: GatewayConfig, counter: TokenCounter, host: str, port: int, log_level: str) -> int:
    import httpx
    import uvicorn

    from embedserve.gateway.app import create_app
    from embedserve.gateway.forward import Forwarder
    from embedserve.gateway.metrics import GatewayMetrics
    from embedserve.gateway.service import GatewayService
    from embedserve.gateway.upstreams import UpstreamSet

    headers: dict[str, str] = {}
    if config.upstream_api_key_env:
        key = os.environ.get(config.upstream_api_key_env)
        if not key:
            raise EmbedServeError(f"upstream_api_key_env: ${config.upstream_api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    # One pooled client for every upstream: connections are reused across requests.
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    timeout = httpx.Timeout(config.timeout_s, connect=5.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        upstreams = UpstreamSet(config, client)
        await upstreams.start()  # refuses to start on mixed schemas
        try:
            metrics = GatewayMetrics(upstreams)
            forwarder = Forwarder(upstreams, metrics, config.balance)
            service = GatewayService(config, counter, upstreams, metrics, forwarder)
            server = uvicorn.Server(
                uvicorn.Config(create_app(service), host=host, port=port, log_level=log_level)
            )
            # uvicorn re-raises SIGTERM after its graceful shutdown; this handler makes that exit 0.
            signal.signal(signal.SIGTERM, _stopped)
            await server.serve()
        finally:
            await upstreams.close()
    return 0


def _stopped(signum: int, frame: FrameType | None) -> None:
    log.info("gateway stopped")
