"""FastAPI app of the gateway: the server's API (every route of api/routes.py, `/v1/models`,
TEI's `/info`, health, `/metrics`) in front of the pools, with the server's request parsing,
error shapes and Bearer API keys (the gateway's own clients' keys, not the pools')."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from embedserve import __version__
from embedserve.api.auth import bearer_check
from embedserve.api.deadline import TIMEOUT_HEADER, header_timeout
from embedserve.api.dispatch import DISPATCHES, Dispatch
from embedserve.api.http import (
    CLIENT_CLOSED,
    ClientGone,
    api_error_handler,
    disconnect_waiter,
    http_error_handler,
    read_body,
    unless_disconnected,
)
from embedserve.api.openapi import Health, Version, metrics_route
from embedserve.api.openapi_contract import served_openapi
from embedserve.api.protocol import ApiError, error_body
from embedserve.api.refusals import CLASS_HEADER, body_priority
from embedserve.api.routes import ROUTES, Route, describe
from embedserve.batch.http import add_batch_routes
from embedserve.batch.online import BatchJobs, running
from embedserve.batch.store import owner_of
from embedserve.gateway.live import Live
from embedserve.gateway.model_routes import add_model_routes, fleet_facts, served_task
from embedserve.gateway.pools.config import TRAFFIC_CLASSES
from embedserve.gateway.routes.classify import CLASSIFY_ROUTE, PREDICT_ROUTE
from embedserve.gateway.routes.cohere_embed import COHERE_EMBED_ROUTE
from embedserve.gateway.routes.embeddings import EMBEDDINGS_ROUTE
from embedserve.gateway.routes.pipeline import Answer, GatewayRoute
from embedserve.gateway.routes.rerank import RERANK_ROUTE
from embedserve.gateway.routes.score import SCORE_ROUTE
from embedserve.gateway.routes.tei import SIMILARITY_ROUTE, TEI_EMBED_ROUTE, TEI_EMBED_SPARSE_ROUTE
from embedserve.gateway.routes.token_routes import EMBED_ALL_ROUTE, POOLING_ROUTE
from embedserve.gateway.routes.tokenize import DECODE_ROUTE, DETOKENIZE_ROUTE, TOKENIZE_ROUTE
from embedserve.gateway.service import GatewayService

log = logging.getLogger(__name__)

Started = tuple[GatewayService, str, Awaitable[Answer]]
# Each declared route bound to its Job (one module per route), all run on gateway/routes/pipeline.py.
_BOUND: dict[str, GatewayRoute[Any]] = {
    b.route.name: b
    for b in (
        EMBEDDINGS_ROUTE,
        COHERE_EMBED_ROUTE,
        RERANK_ROUTE,
        CLASSIFY_ROUTE,
        PREDICT_ROUTE,
        SCORE_ROUTE,
        TEI_EMBED_ROUTE,
        TEI_EMBED_SPARSE_ROUTE,
        TOKENIZE_ROUTE,
        DETOKENIZE_ROUTE,
        SIMILARITY_ROUTE,
        DECODE_ROUTE,
        EMBED_ALL_ROUTE,
        POOLING_ROUTE,
    )
}
# What an unknown path's 404 says the gateway routes.
ROUTES_TEXT = (
    f"POST {describe()}, / and /invocations (the body picks the route); GET /v1/models, /models, "
    "/info, /health/live, /health/ready, /health, /ping, /version, /metrics; /v1/files and "
    "/v1/batches with --batch-dir"
)


def create_app(
    state: Live,
    api_keys: tuple[str, ...] = (),
    batch: tuple[BatchJobs, int] | None = None,
) -> FastAPI:
    """`state`: what the gateway serves, read at every request (gateway/live.py: its models'
    services, gateway/fleet.py: each request's `model` picks one, and its tenants, whose keys are
    accepted too, each request running under its tenant's permissions and quotas:
    gateway/tenancy/tenants.py; a reload swaps both); `batch`: the online batch API's jobs and
    upload limit (`--batch-dir`), else its routes 404; the jobs run while the app's lifespan does."""
    service = state.fleet.default  # settings every model shares (limits, body size) for the docs
    jobs, max_file = batch if batch is not None else (None, 0)

    app = FastAPI(title="embedserve gateway", lifespan=lambda _: running(jobs))
    app.add_exception_handler(ApiError, api_error_handler)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    auth = [Depends(bearer_check(lambda: state.keys(api_keys)))]
    keyed = (401,) if state.keys(api_keys) else ()

    @app.get("/health/live", response_model=None, responses={200: {"model": Health}})
    async def live() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/health/ready", response_model=None, responses=_READY)
    @app.get("/health", response_model=None, responses=_READY)  # TEI's and vLLM's
    @app.get("/ping", response_model=None, responses=_READY)  # SageMaker's (GET or POST)
    @app.post("/ping", response_model=None, responses=_READY)
    async def ready() -> JSONResponse:
        # Ready when every traffic class of every model has at least one pool that can take work.
        missing = []
        fleet = state.fleet
        for s in fleet.services:
            available = s.upstreams.available()
            name = "" if fleet.single else f"{s.config.served_model_name} "
            missing += [name + r.traffic_class for r in s.config.routes if not available & set(r.order)]
        detail = f"no ready pool for {missing}" if missing else "ready"
        body: dict[str, Any] = {"status": "not_ready" if missing else "ready", "detail": detail}
        if fleet.single:
            body["pools"] = fleet.default.upstreams.describe()
        else:
            body["models"] = {name: {"pools": s.upstreams.describe()} for name, s in fleet.by_name.items()}
        return JSONResponse(body, 503 if missing else 200)

    @app.get("/version", response_model=None, responses={200: {"model": Version}})
    async def version() -> dict[str, str]:
        return {"version": __version__}

    def metrics_keys() -> tuple[str, ...]:
        """With tenants, the gateway's own keys only (tenants would read each other's usage),
        where it has any."""
        return api_keys if state.tenants is not None and api_keys else state.keys(api_keys)

    @app.get(
        "/metrics",
        dependencies=[Depends(bearer_check(metrics_keys))],
        response_class=PlainTextResponse,
        **metrics_route(*keyed),
    )
    async def prometheus() -> Response:
        tenants = state.tenants
        text = generate_latest(state.fleet.registry)
        if tenants is not None:  # their own registry, kept across reloads
            text += generate_latest(tenants.metrics.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    add_model_routes(app, state, auth, keyed, api_keys)

    refused = (*keyed, *((403,) if state.tenants is not None else ()))
    statuses = (400, *refused, 404, 408, 413, 422, 429, 500, 502, 503, 504)
    limit = service.config.max_inputs_per_request

    async def answer(request: Request, start: Callable[[bytes, float | None], Started]) -> Response:
        """Read the body, start the work (its traffic class first) with the client's
        X-Request-Timeout, answer it; metrics count every outcome per class."""
        traffic_class = "unknown"
        first = state.fleet.default
        metrics = first.metrics  # the request's model's, once its body named it
        try:
            body = await read_body(request, first.config.max_body_bytes)
            timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
            served, traffic_class, work = start(body, timeout)
            metrics = served.metrics
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

    for route in ROUTES:
        handler_for(route)  # a declared route without a gateway handler stops the start here
        endpoint = _endpoint(route.name, _fixed(route), state, answer, api_keys)
        for path in route.paths:
            app.add_api_route(
                path, endpoint, methods=["POST"], dependencies=auth, **route.doc(limit, statuses)
            )
    for dispatch in DISPATCHES:  # the body (and its model's task) picks the route: api/dispatch.py
        endpoint = _endpoint(dispatch.name, _picked(dispatch), state, answer, api_keys)
        app.add_api_route(
            dispatch.path, endpoint, methods=["POST"], dependencies=auth, **dispatch.doc(limit, statuses)
        )

    def owner(key: str) -> str | None:
        tenants = state.tenants
        return owner_of(key) if tenants is None else tenants.owner_of_key(key)

    add_batch_routes(app, lambda: jobs, auth, lambda: bool(state.keys(api_keys)), max_file, owner)
    app.openapi = served_openapi(app.openapi, lambda: fleet_facts(state.fleet), limit)  # type: ignore[method-assign]
    return app


_READY: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "every traffic class has a pool that can take work"},
    503: {"model": Health, "description": "some traffic class has no ready pool"},
}


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors in the error shape; an unknown path's 404 names the gateway's routes."""
    if exc.status_code != 404:
        return await http_error_handler(request, exc)
    message = (
        f"{request.method} {request.url.path[:200]} is not a route of this gateway: it routes {ROUTES_TEXT}"
    )
    return JSONResponse(error_body(message, "not_found_error", 404), 404)


def handler_for(route: Route[Any]) -> GatewayRoute[Any]:
    """The gateway's work for a declared route (bound to that declaration, not only its name);
    one without any is a startup error."""
    bound = _BOUND.get(route.name)
    if bound is None or bound.route != route:
        raise LookupError(f"route {route.name!r} (api/routes.py) has no gateway handler")
    return bound


Choose = Callable[[bytes, GatewayService], tuple[Route[Any], bytes]]


def _fixed(route: Route[Any]) -> Choose:
    return lambda body, service: (route, body)


def _picked(dispatch: Dispatch) -> Choose:
    return lambda body, service: dispatch.pick(body, served_task(service))


def _endpoint(
    name: str,
    choose: Choose,
    state: Live,
    answer: Callable[[Request, Callable[[bytes, float | None], Started]], Awaitable[Response]],
    own_keys: tuple[str, ...],
) -> Callable[[Request], Awaitable[Response]]:
    """`choose(body, the service its model field names)`: the route to run and its body."""

    async def endpoint(request: Request) -> Response:
        def start(body: bytes, timeout: float | None) -> Started:
            route, body = choose(body, _named(state, body))
            bound = handler_for(route)
            parsed = route.parse(body)
            tenant = state.tenant_of(request.headers, own_keys)  # kept if a reload swaps the map
            service, req = state.fleet.for_request(parsed, None if tenant is None else tenant.may_use)
            traffic_class = _traffic_class(request, *body_priority(req))
            if tenant is None:
                work = service.serve(bound, req, traffic_class, timeout, request.headers)
                return service, traffic_class, work
            names = state.fleet.names_of(getattr(parsed, "model", None), service)

            def run(charge: Callable[[int], None]) -> Awaitable[Answer]:
                return service.serve(bound, req, traffic_class, timeout, request.headers, charge)

            return service, traffic_class, tenant.serve(names, traffic_class, run)

        return await answer(request, start)

    endpoint.__name__ = name  # the OpenAPI operation ids
    return endpoint


def _named(state: Live, body: bytes) -> GatewayService:
    """The service of the model a body's `model` field names (the first model's otherwise, or
    where it names none the gateway serves: the picked route's own checks answer that)."""
    try:
        raw = json.loads(body)
        model = raw.get("model") if isinstance(raw, dict) else None
        return state.fleet.resolve(model if isinstance(model, str) else None)[0]
    except (ValueError, UnicodeDecodeError, ApiError):
        return state.fleet.default


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
