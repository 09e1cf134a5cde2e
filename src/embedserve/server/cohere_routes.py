"""`POST /v2/embed`: Cohere's embed API on the same service as `/v1/embeddings`
(same validation, admission, engine, metrics and metadata); the shapes are in api/cohere.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from embedserve.api.cohere import cohere_body, embeddings_by_type, parse_cohere_request, quantized_type
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
    body = await read_body(request, max_body_bytes)
    req = parse_cohere_request(body)
    kinds = [quantized_type(k) for k in req.embedding_types]
    svc.check_types(kinds, req.output_dimension)
    inner = req.to_embedding_request(svc.engine.config.prompts)
    timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
    done = await svc.compute(inner, disconnect_waiter(request), timeout)
    meta = svc.metadata
    schemas = {
        k: meta.schema(req.output_dimension, None, svc.schema_type(quantized_type(k)))
        for k in req.embedding_types
    }
    metadata = {**meta.fields(req.output_dimension), "embedding_schemas": schemas}
    vectors = embeddings_by_type(done.matrix(), list(req.embedding_types), svc.calibration)
    return JSONResponse(cohere_body(req, vectors, done.n_tokens, metadata), headers=done.headers)
