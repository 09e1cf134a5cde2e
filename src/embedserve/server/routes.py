"""The server's POST routes: every route declared in api/routes.py bound to its Job (one module
per route), and their registration on the app, each on the serving template (server/pipeline.py):
the same body limit, X-Request-Timeout, disconnect watch, error mapping and OpenAPI entry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from embedserve.api.deadline import TIMEOUT_HEADER, header_timeout
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
from embedserve.server.tei_routes import TEI_EMBED_ROUTE, TEI_EMBED_SPARSE_ROUTE
from embedserve.server.tokenize_routes import DETOKENIZE_ROUTE, TOKENIZE_ROUTE

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
    )
}


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
        endpoint = _endpoint(bound, service, settings.max_body_bytes, settings.body_timeout_s)
        doc = bound.route.doc(settings.max_inputs_per_request, statuses)
        for path in bound.route.paths:
            app.add_api_route(path, endpoint, methods=["POST"], dependencies=dependencies, **doc)


def _endpoint(
    bound: ServerRoute[Any],
    service: Callable[[], EmbeddingService],
    max_body_bytes: int,
    body_timeout_s: float,
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        svc = service()

        async def work(trace: RequestSpan | None = None) -> Response:
            body = await read_body(request, max_body_bytes, body_timeout_s)
            timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
            data, headers = await answer(svc, bound, body, disconnect_waiter(request), timeout, trace)
            return JSONResponse(data, headers=headers)

        what = f"{bound.route.path} request"
        if svc.tracing is None:
            return await answered(what, work)
        # The request's span (child of the caller's traceparent), ended once its body is serialized.
        with svc.tracing.request(bound.route.name, request.url.path, request.headers, {}) as trace:
            response = await answered(what, lambda: work(trace))
            trace.responded(response.status_code)
            return response

    endpoint.__name__ = bound.route.name  # the OpenAPI operation ids
    return endpoint
