"""`POST /v2/embed`: Cohere's embed API on the same service as `/v1/embeddings`
(same validation, admission, engine, metrics and metadata); the shapes are in api/cohere.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from embedserve.api.cohere import (
    CohereEmbedRequest,
    cohere_body,
    embeddings_by_type,
    parse_cohere_request,
    quantized_type,
)
from embedserve.api.deadline import TIMEOUT_HEADER, header_timeout
from embedserve.api.http import COHERE_EMBED_PATH, answered, disconnect_waiter, read_body
from embedserve.server.serving import EmbeddingService


def add_cohere_routes(
    app: FastAPI,
    service: Callable[[], EmbeddingService],
    max_body_bytes: int,
    dependencies: list[Any],
    doc: dict[str, Any] | None = None,
) -> None:
    """`service()` returns the accepting service or raises the 503 ApiError; `doc`: the
    route's OpenAPI keyword arguments (api/openapi_routes.py)."""

    @app.post(COHERE_EMBED_PATH, dependencies=dependencies, **(doc or {}))
    async def cohere_embed(request: Request) -> Response:
        svc = service()
        return await answered("/v2/embed request", lambda: _embed(svc, request, max_body_bytes))


async def _embed(svc: EmbeddingService, request: Request, max_body_bytes: int) -> Response:
    req = parse_cohere_request(await read_body(request, max_body_bytes))
    timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
    body, headers = await cohere_embed(svc, req, disconnect_waiter(request), timeout)
    return JSONResponse(body, headers=headers)


async def cohere_embed(
    svc: EmbeddingService,
    req: CohereEmbedRequest,
    wait_disconnect: Callable[[], Awaitable[None]],
    timeout_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """One parsed /v2/embed request: (response body, timing headers); also a Ray Serve
    replica's (scale/replica.py). `timeout_s`: the caller's deadline (X-Request-Timeout)."""
    kinds = [quantized_type(k) for k in req.embedding_types]
    svc.check_types(kinds, req.output_dimension)
    inner = req.to_embedding_request(svc.engine.config.prompts)
    done = await svc.compute(inner, wait_disconnect, timeout_s)
    meta = svc.metadata
    schemas = {
        k: meta.schema(req.output_dimension, None, svc.schema_type(quantized_type(k)))
        for k in req.embedding_types
    }
    metadata = {**meta.fields(req.output_dimension), "embedding_schemas": schemas}
    vectors = embeddings_by_type(done.matrix(), list(req.embedding_types), svc.calibration)
    return cohere_body(req, vectors, done.n_tokens, metadata), done.headers
