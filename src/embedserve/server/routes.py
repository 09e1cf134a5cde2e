"""The server's POST routes: every route declared in api/routes.py bound to its Job (one module
per route), and their registration on the app, each on the serving template (server/pipeline.py):
the same body limit, X-Request-Timeout, disconnect watch, error mapping and OpenAPI entry. The
paths whose body picks the route (api/dispatch.py: TEI's `/`, `/invocations`) run the one picked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from embedserve.api.deadline import TIMEOUT_HEADER, header_timeout
from embedserve.api.dispatch import DISPATCHES, Dispatch
from embedserve.api.http import answered, disconnect_waiter, read_body
from embedserve.api.routes import ROUTES, Route
from embedserve.server.classify_routes import CLASSIFY_ROUTE, PREDICT_ROUTE
from embedserve.server.cohere_routes import COHERE_EMBED_ROUTE
from embedserve.server.embeddings_routes import EMBEDDINGS_ROUTE
from embedserve.server.pipeline import ServerRoute, answer
from embedserve.server.rerank_routes import RERANK_ROUTE
from embedserve.server.runtime import ServerSettings
from embedserve.server.score_routes import SCORE_ROUTE
from embedserve.server.serving import EmbeddingService
from embedserve.server.tei_routes import SIMILARITY_ROUTE, TEI_EMBED_ROUTE, TEI_EMBED_SPARSE_ROUTE
from embedserve.server.token_routes import EMBED_ALL_ROUTE, POOLING_ROUTE
from embedserve.server.tokenize_routes import DECODE_ROUTE, DETOKENIZE_ROUTE, TOKENIZE_ROUTE

if TYPE_CHECKING:
    from embedserve.tracing.otel import RequestSpan

_BOUND: dict[str, ServerRoute[Any]] = {
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
Choose = Callable[[bytes, EmbeddingService], tuple[ServerRoute[Any], bytes]]


def server_routes(routes: tuple[Route[Any], ...] = ROUTES) -> tuple[ServerRoute[Any], ...]:
    """Every declared route, bound; a declared route the server cannot run is a startup error."""
    missing = [r.name for r in routes if r.name not in _BOUND or _BOUND[r.name].route != r]
    if missing:
        raise LookupError(f"routes declared in api/routes.py without a server Job: {missing}")
    return tuple(_BOUND[r.name] for r in routes)


def add_routes(
    app: FastAPI,
    service: Callable[[], EmbeddingService],
    settings: ServerSettings,
    dependencies: list[Any],
    statuses: tuple[int, ...],
) -> None:
    """Every route at each of its paths. `service()`: the accepting service or the 503 ApiError;
    `statuses`: what the routes answer, for `/openapi.json`."""
    for bound in server_routes():
        endpoint = _endpoint(bound.route.name, bound.route.path, _fixed(bound), service, settings)
        doc = bound.route.doc(settings.max_inputs_per_request, statuses)
        for path in bound.route.paths:
            app.add_api_route(path, endpoint, methods=["POST"], dependencies=dependencies, **doc)
    for dispatch in DISPATCHES:
        endpoint = _endpoint(dispatch.name, dispatch.path, _picked(dispatch), service, settings)
        doc = dispatch.doc(settings.max_inputs_per_request, statuses)
        app.add_api_route(dispatch.path, endpoint, methods=["POST"], dependencies=dependencies, **doc)


def _fixed(bound: ServerRoute[Any]) -> Choose:
    return lambda body, svc: (bound, body)


def _picked(dispatch: Dispatch) -> Choose:
    """The route the body picks for the served model's task (api/dispatch.py)."""

    def choose(body: bytes, svc: EmbeddingService) -> tuple[ServerRoute[Any], bytes]:
        route, body = dispatch.pick(body, svc.engine.config.task)
        return _BOUND[route.name], body

    return choose


def _endpoint(
    name: str, path: str, choose: Choose, service: Callable[[], EmbeddingService], settings: ServerSettings
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        svc = service()

        async def work(trace: RequestSpan | None = None) -> Response:
            body = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
            bound, body = choose(body, svc)
            timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
            data, headers = await answer(svc, bound, body, disconnect_waiter(request), timeout, trace)
            return JSONResponse(data, headers=headers)

        what = f"{path} request"
        if svc.tracing is None:
            return await answered(what, work)
        # The request's span (child of the caller's traceparent), ended once its body is serialized.
        with svc.tracing.request(name, request.url.path, request.headers, {}) as trace:
            response = await answered(what, lambda: work(trace))
            trace.responded(response.status_code)
            return response

    endpoint.__name__ = name  # the OpenAPI operation ids
    return endpoint
