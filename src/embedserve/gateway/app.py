"""FastAPI app of the gateway: the server's API (`/v1/embeddings`, `/v2/embed`, `/v1/rerank`,
`/v1/models`, health, `/metrics`) in front of the pools, with the server's request parsing,
error shapes and Bearer API keys (the gateway's own clients' keys, not the pools')."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from embedserve.api.auth import bearer_check
from embedserve.api.cohere import parse_cohere_request
from embedserve.api.deadline import TIMEOUT_HEADER, header_timeout
from embedserve.api.http import (
    CLIENT_CLOSED,
    COHERE_EMBED_PATH,
    EMBEDDINGS_PATH,
    RERANK_PATH,
    ClientGone,
    api_error_handler,
    disconnect_waiter,
    http_error_handler,
    read_body,
    unless_disconnected,
)
from embedserve.api.openapi import (
    Health,
    ModelCard,
    ModelList,
    embeddings_route,
    error_responses,
    metrics_route,
)
from embedserve.api.openapi_routes import cohere_embed_route, rerank_route
from embedserve.api.protocol import ApiError, clip, error_body, parse_request
from embedserve.api.rerank import parse_rerank_request
from embedserve.gateway import whole
from embedserve.gateway.cohere_embed import cohere_embed
from embedserve.gateway.config import TRAFFIC_CLASSES
from embedserve.gateway.service import GatewayService

log = logging.getLogger(__name__)

# Traffic class as a header, for clients that cannot add the `priority` body field.
CLASS_HEADER = "x-embedserve-priority"
RERANK_PATHS = (RERANK_PATH, "/rerank", "/v2/rerank")  # as the server
ROUTES = f"POST {EMBEDDINGS_PATH}, {COHERE_EMBED_PATH}, {', '.join(RERANK_PATHS)}; GET /v1/models, " + (
    "/health/live, /health/ready, /metrics"
)

Started = tuple[str, Awaitable[tuple[dict[str, Any], dict[str, str]]]]


def create_app(service: GatewayService, api_keys: tuple[str, ...] = ()) -> FastAPI:
    upstreams = service.upstreams
    metrics = service.metrics
    app = FastAPI(title="embedserve gateway")
    app.add_exception_handler(ApiError, api_error_handler)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    auth = [Depends(bearer_check(api_keys))]
    keyed = (401,) if api_keys else ()

    @app.get("/health/live", response_model=None, responses={200: {"model": Health}})
    async def live() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/health/ready", response_model=None, responses=_READY)
    async def ready() -> JSONResponse:
        available = upstreams.available()
        # Ready when every traffic class it routes has at least one pool that can take work.
        missing = [r.traffic_class for r in service.config.routes if not available.intersection(r.order)]
        detail = f"no ready pool for {missing}" if missing else "ready"
        body = {
            "status": "not_ready" if missing else "ready",
            "detail": detail,
            "pools": upstreams.describe(),
        }
        return JSONResponse(body, 503 if missing else 200)

    @app.get("/metrics", dependencies=auth, response_class=PlainTextResponse, **metrics_route(*keyed))
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/v1/models",
        dependencies=auth,
        response_model=None,
        responses={200: {"model": ModelList}, **error_responses(*keyed, 503)},
    )
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(service)]}

    @app.get(
        "/v1/models/{model_id:path}",
        dependencies=auth,
        response_model=None,
        responses={200: {"model": ModelCard}, **error_responses(*keyed, 404, 503)},
    )
    async def model(model_id: str) -> dict[str, Any]:
        card = _model_card(service)
        if model_id != card["id"]:
            raise ApiError(
                404,
                f"model {clip(model_id)} not found; this gateway serves {card['id']!r}",
                "not_found_error",
            )
        return card

    statuses = (400, *keyed, 404, 408, 413, 422, 429, 500, 502, 503, 504)
    limit = service.config.max_inputs_per_request

    async def answer(request: Request, start: Callable[[bytes, float | None], Started]) -> Response:
        """Read the body, start the work (its traffic class first) with the client's
        X-Request-Timeout, answer it; metrics count every outcome per class."""
        traffic_class = "unknown"
        try:
            body = await read_body(request, service.config.max_body_bytes)
            timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
            traffic_class, work = start(body, timeout)
            data, headers = await unless_disconnected(work, disconnect_waiter(request))
        except ClientGone:
            metrics.requests.labels(traffic_class, str(CLIENT_CLOSED)).inc()
            return Response(status_code=CLIENT_CLOSED)
        except ApiError as e:
            metrics.requests.labels(traffic_class, str(e.status)).inc()
            raise
        except Exception as e:  # a bug of ours: answer it (and count it) rather than drop the connection
            log.exception("gateway request failed")
            metrics.requests.labels(traffic_class, "500").inc()
            raise ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error") from e
        metrics.requests.labels(traffic_class, "200").inc()
        return JSONResponse(data, headers=headers)

    @app.post(EMBEDDINGS_PATH, dependencies=auth, **embeddings_route(limit, statuses))
    async def embeddings(request: Request) -> Response:
        def start(body: bytes, timeout: float | None) -> Started:
            req = parse_request(body)
            traffic_class = _traffic_class(request, req.priority, "priority" in req.model_fields_set)
            return traffic_class, service.embed(req, traffic_class, timeout)

        return await answer(request, start)

    errors = error_responses(*statuses)

    @app.post(COHERE_EMBED_PATH, dependencies=auth, **cohere_embed_route(limit, errors))
    async def cohere(request: Request) -> Response:
        def start(body: bytes, timeout: float | None) -> Started:
            req = parse_cohere_request(body)
            traffic_class = _traffic_class(request, "online", False)
            return traffic_class, cohere_embed(service, req, traffic_class, timeout)

        return await answer(request, start)

    async def rerank(request: Request) -> Response:
        def start(body: bytes, timeout: float | None) -> Started:
            req = parse_rerank_request(body)
            traffic_class = _traffic_class(request, req.priority, "priority" in req.model_fields_set)
            return traffic_class, whole.rerank(service, req, traffic_class, timeout)

        return await answer(request, start)

    for path in RERANK_PATHS:
        app.add_api_route(path, rerank, methods=["POST"], dependencies=auth, **rerank_route(limit, errors))

    return app


_READY: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "every traffic class has a pool that can take work"},
    503: {"model": Health, "description": "some traffic class has no ready pool"},
}


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors in the error shape; an unknown path's 404 names the gateway's routes."""
    if exc.status_code != 404:
        return await http_error_handler(request, exc)
    message = f"{request.method} {request.url.path[:200]} is not a route of this gateway: it routes {ROUTES}"
    return JSONResponse(error_body(message, "not_found_error", 404), 404)


def _traffic_class(request: Request, body_priority: str, body_set: bool) -> str:
    header = request.headers.get(CLASS_HEADER)
    if header is None:
        return body_priority
    if header not in TRAFFIC_CLASSES:
        raise ApiError(400, f"header {CLASS_HEADER}: expected one of {list(TRAFFIC_CLASSES)}, got {header!r}")
    if body_set and header != body_priority:
        raise ApiError(
            400, f"header {CLASS_HEADER}={header!r} contradicts the body's priority={body_priority!r}"
        )
    return header


def _model_card(service: GatewayService) -> dict[str, Any]:
    card = service.upstreams.model_card()
    if card is None:
        raise ApiError(503, "no upstream is in rotation yet", "service_unavailable", {"Retry-After": "1"})
    pools = service.upstreams.describe()
    return {
        **card,
        "id": service.model_name,
        "created": int(time.time()),
        "owned_by": "embedserve-gateway",
        # Inputs longer than this follow the request's truncate policy.
        "max_model_len": max(p["max_tokens"] for p in pools.values()),
        "embedding_schema": service.upstreams.schema,
        "pools": pools,
    }
