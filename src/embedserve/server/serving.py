"""The server's embedding service: the engine with the limits, deadline, metrics and compressed
types every route shares (server/pipeline.py runs a request through them), and the mapping of
engine exceptions to HTTP statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from embedserve.api.deadline import DEADLINE_EXCEEDED, TIMEOUT_HEADER, effective_timeout
from embedserve.api.protocol import ApiError
from embedserve.api.quantize import Calibration, schema_type
from embedserve.api.refusals import model_not_found
from embedserve.engine.adapters import UnknownAdapterError, view
from embedserve.engine.engine import Engine
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.errors import (
    API_REMEDY,
    EngineDeadError,
    ImageTooLargeError,
    InputTooLongError,
    InternalEngineError,
    InvalidInputError,
)
from embedserve.lengths import bucket_of
from embedserve.lora.adapter import LoraAdapter
from embedserve.pooling.outputs import Output
from embedserve.schema import ModelMetadata
from embedserve.server.admission import Admission
from embedserve.server.metrics import ServerMetrics
from embedserve.server.result_cache import ResultCache

if TYPE_CHECKING:
    from embedserve.tracing.otel import Tracing

T = TypeVar("T")


class EmbeddingService:
    def __init__(
        self,
        engine: Engine,
        metadata: ModelMetadata,
        admission: Admission,
        metrics: ServerMetrics,
        max_inputs_per_request: int,
        on_forward_failure: Callable[[], None],
        request_timeout_s: float = 300.0,
        calibration: Calibration | None = None,
        tracing: Tracing | None = None,
        result_cache: ResultCache | None = None,
        max_output_vectors: int = 32768,
    ) -> None:
        self.engine = engine
        self.result_cache = result_cache  # None: off (server/result_cache.py)
        self.tracing = tracing  # None: tracing off (tracing/__init__.py)
        engine.name = metadata.model  # errors name the model as clients know it (--served-model-name)
        self.calibration = calibration or Calibration.fixed()
        self.metadata = metadata
        self.admission = admission
        self.metrics = metrics
        self.max_inputs_per_request = max_inputs_per_request
        self.max_output_vectors = max_output_vectors  # multi-vector answers (server/multivector_routes.py)
        self.on_forward_failure = on_forward_failure  # the runtime's probe after a failed forward pass
        self.request_timeout_s = request_timeout_s
        self.views: dict[LoraAdapter, EmbeddingService] = {}  # LoRA adapters' services (`serving`)
        self.parent: str | None = None  # a LoRA adapter's service: its base model's name

    def serving(self, model: str | None) -> EmbeddingService:
        """The service answering for `model` (a request's `model` field): this one, or a LoRA
        adapter's on the same engine, queue and limits; 404 naming the served models."""
        if model is None or model == self.metadata.model:
            return self
        adapters = self.engine.adapters
        try:
            adapter = None if adapters is None else adapters.get(model)
        except UnknownAdapterError:
            adapter = None
        if adapter is None:
            raise model_not_found(model, ", ".join(self.served_names()))
        svc = self.views.get(adapter)  # by the adapter object: a name loaded again is another one
        if svc is None:
            svc = copy.copy(self)
            svc.engine = view(self.engine, adapter)
            svc.metadata = self.metadata.with_adapter(adapter.name, adapter.fingerprint)
            svc.parent = self.metadata.model
            live = set(adapters.all()) if adapters is not None else set()
            self.views = {a: s for a, s in self.views.items() if a in live} | {adapter: svc}
        return svc

    def served_names(self) -> list[str]:
        """The base model's name, then each loaded LoRA adapter's."""
        adapters = self.engine.adapters
        return [self.metadata.model, *(a.name for a in (adapters.all() if adapters is not None else []))]

    def schema_type(self, kind: str) -> str:
        return schema_type(kind, self.calibration)

    async def within_deadline(self, work: Awaitable[T], caller_timeout_s: float | None) -> T:
        """`work` (queued engine work) within the request deadline, else cancelled (aborting
        it) and answered 503 `deadline_exceeded` + Retry-After (api/deadline.py)."""
        timeout = effective_timeout(self.request_timeout_s, caller_timeout_s)
        try:
            return await asyncio.wait_for(work, timeout)
        except asyncio.TimeoutError:
            wait = str(self.admission.retry_after())
            whose = "--request-timeout" if timeout == self.request_timeout_s else TIMEOUT_HEADER
            raise ApiError(
                503,
                f"request not answered within {timeout:g} s ({whose}; queue and compute): its work "
                f"was cancelled; retry in {wait} s",
                DEADLINE_EXCEEDED,
                {"Retry-After": wait},
            ) from None

    def check_types(self, kinds: list[str], dimensions: int | None, one_pass: bool = False) -> None:
        """Refuse (400) a type the model does not produce (sparse vs dense) or a compressed type
        this server cannot produce at that width."""
        sparse = Output.SPARSE in self.engine.outputs
        if Output.LEXICAL in self.engine.outputs:  # BGE-M3: dense or sparse, one at a time
            if Output.SPARSE.value in kinds and len(kinds) > 1 and not one_pass:
                raise ApiError(
                    400,
                    f"model {self.metadata.model} answers dense and sparse vectors in separate requests on "
                    "this route (POST /v2/embed with embedding_types ['float', 'sparse']: both, one pass)",
                )
            if kinds == [Output.SPARSE.value] and dimensions is not None:
                raise ApiError(
                    400, "dimensions does not apply to sparse vectors (one weight per vocabulary id)"
                )
            return self.check_compressed(kinds, dimensions)
        wrong = next((k for k in kinds if (k == Output.SPARSE.value) != sparse), None)
        if wrong is not None:
            name = self.metadata.model
            if sparse:
                raise ApiError(
                    400,
                    f"model {name} produces sparse vectors (SPLADE term weights over its vocabulary), "
                    f"not {wrong!r}: ask for embedding_type 'sparse'",
                )
            raise ApiError(
                400,
                f"model {name} produces dense vectors: sparse vectors come from a SPLADE model "
                "(a sentence-transformers SparseEncoder directory) or BGE-M3 (with its sparse_linear.pt)",
            )
        self.check_compressed(kinds, dimensions)

    def check_compressed(self, kinds: list[str], dimensions: int | None) -> None:
        dim = dimensions or self.metadata.hidden_size
        if any(k in ("int8", "uint8") for k in kinds):
            try:
                self.calibration.ranges_for(dim)
            except ValueError as e:
                raise ApiError(400, f"int8/uint8 at {dim} dimensions: {e}") from None

    def observe(self, outputs: list[EmbeddingOutput], tokenize_time: float, total: float) -> None:
        m = self.metrics
        n_tokens = 0
        for out in outputs:
            m.input_tokens.observe(out.num_tokens)
            m.queue_time.observe(out.queue_time)
            m.inference_time.observe(out.inference_time)
            n_tokens += out.num_tokens
        m.tokens.inc(n_tokens)
        self.admission.meter.add(n_tokens)
        m.tokenization_time.observe(tokenize_time)
        m.latency.labels(bucket_of(max(o.num_tokens for o in outputs))).observe(total)


@contextlib.contextmanager
def engine_errors(on_forward_failure: Callable[[], None], remedy: str = API_REMEDY) -> Iterator[None]:
    """Engine exceptions -> HTTP statuses. Bad input is the caller's fault; the rest is ours.
    `remedy`: how the route's body asks for truncation, for an over-long input's message."""
    try:
        yield
    except ImageTooLargeError as e:
        raise ApiError(413, str(e)) from None
    except InputTooLongError as e:
        raise ApiError(400, str(e.with_remedy(remedy))) from None
    except InvalidInputError as e:
        raise ApiError(400, str(e)) from None
    except EngineDeadError as e:
        raise ApiError(503, str(e), "service_unavailable", {"Retry-After": "2"}) from None
    except InternalEngineError as e:
        on_forward_failure()
        raise ApiError(500, f"the engine failed to compute this request: {e}", "server_error") from None


def timing_headers(outputs: list[EmbeddingOutput], tokenize_time: float, total: float) -> dict[str, str]:
    """Milliseconds, TEI-style; a batch reports its slowest input's queue and inference time."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.2f}"

    return {
        "x-tokenization-time": ms(tokenize_time),
        "x-queue-time": ms(max(o.queue_time for o in outputs)),
        "x-inference-time": ms(max(o.inference_time for o in outputs)),
        "x-total-time": ms(total),
    }
