"""FastAPI application: routes, authentication, body limits and error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedserve import __version__
from embedserve.api.auth import bearer_check
from embedserve.api.http import api_error_handler, http_error_handler
from embedserve.api.openapi import Health, ModelCard, ModelList, Version, error_responses, metrics_route
from embedserve.api.openapi_contract import ModelFacts, served_openapi
from embedserve.api.protocol import ApiError
from embedserve.api.routes import EMBEDDINGS_PATH
from embedserve.api.tei import TeiInfo, model_type
from embedserve.api.tei import info as tei_info
from embedserve.batch.http import add_batch_routes
from embedserve.batch.online import running
from embedserve.pooling.outputs import Output, multivectors_only
from embedserve.schema import multivector_type
from embedserve.server.batch_api import server_batch_jobs
from embedserve.server.lora_routes import add_lora_routes
from embedserve.server.metrics import ServerMetrics
from embedserve.server.routes import add_routes
from embedserve.server.runtime import ServerRuntime, ServerSettings
from embedserve.server.serving import EmbeddingService


def create_app(settings: ServerSettings, on_fatal: Callable[[str], None] | None = None) -> FastAPI:
    """Build the app; the model loads in the background once the app's lifespan starts."""
    metrics = ServerMetrics()
    runtime = ServerRuntime(settings, metrics, on_fatal)
    batch = settings.batch
    jobs = None
    if batch is not None:
        jobs = server_batch_jobs(batch, runtime, lambda: _service(runtime), settings.max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(runtime.start())
        try:
            async with running(jobs):
                yield
        finally:
            runtime.begin_drain()
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            await runtime.close()

    app = FastAPI(title="embedserve", lifespan=lifespan)
    app.state.runtime = runtime
    app.add_middleware(_CountStatuses, counter=metrics.requests, path=EMBEDDINGS_PATH)
    app.add_exception_handler(ApiError, api_error_handler)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error_handler)  # type: ignore[arg-type]
    auth = Depends(bearer_check(settings.api_keys))
    keyed = (401,) if settings.api_keys else ()

    @app.get("/health/live", response_model=None, responses={200: {"model": Health}})
    async def live() -> dict[str, str]:
        return {"status": "alive", "phase": runtime.phase.value}

    @app.get("/health/ready", response_model=None, responses=_READY)
    @app.get("/health", response_model=None, responses=_READY)  # TEI's and vLLM's
    @app.get("/ping", response_model=None, responses=_READY)  # SageMaker's (GET or POST)
    @app.post("/ping", response_model=None, responses=_READY)
    async def ready() -> JSONResponse:
        ok, reason = await runtime.readiness()
        return JSONResponse({"status": "ready" if ok else "not_ready", "detail": reason}, 200 if ok else 503)

    @app.get("/metrics", dependencies=[auth], response_class=PlainTextResponse, **metrics_route(*keyed))
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version", response_model=None, responses={200: {"model": Version}})
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get(
        "/v1/models",
        dependencies=[auth],
        response_model=None,
        responses={200: {"model": ModelList}, **error_responses(*keyed, 503)},
    )
    @app.get(  # Infinity's path
        "/models",
        dependencies=[auth],
        response_model=None,
        responses={200: {"model": ModelList}, **error_responses(*keyed, 503)},
    )
    async def models() -> dict[str, Any]:
        svc = _service(runtime)  # the base model, then its LoRA adapters
        cards = []
        for name in svc.served_names():
            with contextlib.suppress(ApiError):  # an adapter unloaded meanwhile
                cards.append(model_card(svc.serving(name)))
        return {"object": "list", "data": cards}

    @app.get(
        "/v1/models/{model_id:path}",
        dependencies=[auth],
        response_model=None,
        responses={200: {"model": ModelCard}, **error_responses(*keyed, 404, 503)},
    )
    async def model(model_id: str) -> dict[str, Any]:
        return model_card(_service(runtime).serving(model_id))

    @app.get(
        "/info",
        dependencies=[auth],
        response_model=None,
        responses={200: {"model": TeiInfo}, **error_responses(*keyed, 503)},
    )
    async def info() -> dict[str, Any]:
        """Text Embeddings Inference's model and limits (api/tei.py)."""
        svc = _service(runtime)
        config = svc.engine.config
        kind = model_type(config.task, config.pooling.method.value, config.model.labels)
        budget = config.scheduler.max_num_batched_tokens
        return tei_info(model_card(svc), kind, budget, svc.max_inputs_per_request, svc.admission.max_inputs)

    statuses = (400, *keyed, 404, 408, 413, 422, 429, 500, 503)
    add_routes(app, lambda: _service(runtime), settings, [auth], statuses)
    max_file = batch.max_file_bytes if batch is not None else 0
    add_batch_routes(app, lambda: jobs, [auth], bool(settings.api_keys), max_file)
    if settings.engine.enable_lora or settings.engine.lora_modules:
        add_lora_routes(app, lambda: _service(runtime), bool(settings.api_keys), [auth])

    def facts() -> ModelFacts | None:
        return None if runtime.service is None else model_facts(runtime.service)

    app.openapi = served_openapi(app.openapi, facts, settings.max_inputs_per_request)  # type: ignore[method-assign]
    return app


_READY: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "loaded, warmed up, engine healthy"},
    503: {"model": Health, "description": "loading, warming up, failed, draining or engine unhealthy"},
}


def _service(runtime: ServerRuntime) -> EmbeddingService:
    """The service, if this server accepts work now; otherwise 503 saying why not."""
    if runtime.accepting and runtime.service is not None:
        return runtime.service
    reason = runtime.error or runtime.phase.value.replace("_", " ")
    raise ApiError(
        503, f"server is not accepting requests ({reason})", "service_unavailable", {"Retry-After": "1"}
    )


def model_facts(service: EmbeddingService) -> ModelFacts:
    config = service.engine.config
    return ModelFacts.of_card(model_card(service), config.task, config.model.vocab_size)


def model_card(service: EmbeddingService) -> dict[str, Any]:
    meta = service.metadata
    pooling = service.engine.config.pooling
    outputs = service.engine.outputs
    head = service.engine.multivector_head
    token_dim = service.engine.renderer.spec.token_dim  # a multi-vector model's (None: not one)
    only = multivectors_only(outputs)
    # the schema its answers carry: a SPLADE model's are all sparse, a ColBERT model's multi-vectors
    fields = meta.fields(embedding_type=Output.SPARSE.value if Output.SPARSE in outputs else "float")
    if only:
        assert head is not None
        fields = meta.fields(head.dim, head.normalize, multivector_type("float"))
    return {
        "id": meta.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "embedserve",
        **fields,
        "dimensions": token_dim if only else meta.hidden_size,
        **({"multivector_dimensions": token_dim} if Output.MULTIVECTOR in outputs else {}),
        "max_model_len": meta.max_model_len,
        "pooling": Output.MULTIVECTOR.value if only else pooling.method.value,
        "normalize": pooling.normalize,
        "prompt_names": sorted(service.engine.config.prompts),
        "vocab_size": service.engine.config.model.vocab_size,
        "outputs": model_outputs(service),
        **({} if service.parent is None else {"parent": service.parent}),  # a LoRA adapter's base model
    }


def model_outputs(service: EmbeddingService) -> list[str]:
    """What the model emits: dense vectors (not a SPLADE or multi-vector-only model), sparse
    ones (SPLADE, BGE-M3's lexical weights), multi-vectors, and whether it reads images."""
    engine = service.engine
    outputs = engine.outputs
    only = Output.SPARSE in outputs or multivectors_only(outputs)
    return [
        *([] if only else ["dense"]),
        *([Output.SPARSE.value] if outputs & {Output.SPARSE, Output.LEXICAL} else []),
        *([Output.MULTIVECTOR.value] if Output.MULTIVECTOR in outputs else []),
        *(["images"] if engine.config.multimodal else []),
    ]


class _CountStatuses:
    """Counts the statuses of one path's responses (every exit path, auth failures included)."""

    def __init__(self, app: ASGIApp, counter: Counter, path: str) -> None:
        self.app = app
        self.counter = counter
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counter.labels(str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
