"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`) on the server's engine and its limits:
the same admission (413 / 429), metrics, timing headers and metadata as `/v1/embeddings`.
Every refusal happens before anything is queued (as serving.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from embedserve.api.deadline import TIMEOUT_HEADER, header_timeout
from embedserve.api.http import answered, disconnect_waiter, read_body, unless_disconnected
from embedserve.api.protocol import ApiError
from embedserve.api.rerank import RerankRequest, parse_rerank_request, rerank_body
from embedserve.engine.engine import output_of
from embedserve.engine.rerank import ranked
from embedserve.server.serving import EmbeddingService, timing_headers

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


async def rerank(
    svc: EmbeddingService,
    req: RerankRequest,
    wait_disconnect: Callable[[], Awaitable[None]],
    timeout_s: float | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    start = time.perf_counter()
    engine, meta = svc.engine, svc.metadata
    if engine.config.task != "rerank":
        raise ApiError(400, f"model {meta.model!r} is an embedding model: POST /v1/embeddings")
    if req.model is not None and req.model != meta.model:
        raise ApiError(
            404, f"model {req.model!r} not found; this server serves {meta.model!r}", "not_found_error"
        )
    if len(req.documents) > svc.max_inputs_per_request:
        raise ApiError(
            400, f"{len(req.documents)} documents in one request; the limit is {svc.max_inputs_per_request}"
        )
    with svc.engine_errors():
        tokenized = await asyncio.to_thread(
            engine.tokenize_pairs, req.query, req.texts, req.truncate, req.instruction
        )
    tokenize_time = time.perf_counter() - start
    n_tokens = sum(len(t.token_ids) for t in tokenized)
    admission = svc.admission
    if not admission.fits_ever(len(tokenized), n_tokens):
        raise ApiError(
            413,
            f"request holds {len(tokenized)} pairs / {n_tokens} tokens; this server queues at most "
            f"{admission.max_inputs} inputs / {admission.max_tokens} tokens: split it",
        )
    ticket = admission.try_admit(len(tokenized), n_tokens)
    if ticket is None:
        retry = admission.retry_after()
        raise ApiError(
            429, f"server is at capacity; retry in {retry} s", "rate_limit_error", {"Retry-After": str(retry)}
        )
    try:
        with svc.engine_errors():
            work = engine.rerank_tokenized_async(tokenized, priority=req.priority)
            done = await svc.within_deadline(unless_disconnected(work, wait_disconnect), timeout_s)
    finally:
        admission.release(ticket)
    outputs = [output_of(f, t) for f, t in zip(done, tokenized, strict=True)]
    rows = torch.from_numpy(np.stack([o.embedding for o in outputs]))
    results = ranked(engine.scores(rows, req.raw_scores), tokenized, req.top_n)
    total = time.perf_counter() - start
    svc.observe(outputs, tokenize_time, total)
    body = rerank_body(req, [(r.index, r.relevance_score) for r in results], n_tokens, meta.fields())
    return body, timing_headers(outputs, tokenize_time, total)


def add_rerank_routes(
    app: FastAPI,
    service: Callable[[], EmbeddingService],
    max_body_bytes: int,
    dependencies: list[Any],
    doc: dict[str, Any] | None = None,
) -> None:
    """`service()` returns the accepting service or raises the 503 ApiError; `doc`: the
    routes' OpenAPI keyword arguments (api/openapi_routes.py)."""

    async def rerank_route(request: Request) -> Response:
        svc = service()

        async def work() -> Response:
            req = parse_rerank_request(await read_body(request, max_body_bytes))
            timeout = header_timeout(request.headers.get(TIMEOUT_HEADER))
            body, headers = await rerank(svc, req, disconnect_waiter(request), timeout)
            return JSONResponse(body, headers=headers)

        return await answered("rerank request", work)

    for path in RERANK_PATHS:
        app.add_api_route(path, rerank_route, methods=["POST"], dependencies=dependencies, **(doc or {}))
