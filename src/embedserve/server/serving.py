"""One embeddings request: validate, tokenize, admit, run on the engine, answer.

Order matters: everything that can refuse a request (unknown model, bad input, too long,
over the queue bound) runs before anything is queued in the engine, so a refused request
costs no engine work and an admitted one is admitted whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from embedserve.api.deadline import DEADLINE_EXCEEDED, TIMEOUT_HEADER, effective_timeout
from embedserve.api.http import unless_disconnected
from embedserve.api.multimodal import resolve_items
from embedserve.api.protocol import ApiError, EmbeddingRequest, clip, encode_vector
from embedserve.api.quantize import Calibration, quantize, schema_type, to_base64
from embedserve.engine.engine import EmbeddingOutput, Engine
from embedserve.errors import EngineDeadError, ImageTooLargeError, InternalEngineError, InvalidInputError
from embedserve.lengths import bucket_of
from embedserve.schema import ModelMetadata
from embedserve.server.admission import Admission
from embedserve.server.metrics import ServerMetrics
from embedserve.tokenizer import Tokenized

T = TypeVar("T")


@dataclass(frozen=True)
class EmbeddingResult:
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True)
class Computed:
    """One request's vectors before they are put in a response body (OpenAI or Cohere)."""

    tokenized: list[Tokenized]
    outputs: list[EmbeddingOutput]
    n_tokens: int
    headers: dict[str, str]

    def matrix(self) -> np.ndarray:
        return np.stack([o.embedding for o in self.outputs])  # float32 [n, dim]


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
    ) -> None:
        self.engine = engine
        self.calibration = calibration or Calibration.fixed()
        self.metadata = metadata
        self.admission = admission
        self.metrics = metrics
        self.max_inputs_per_request = max_inputs_per_request
        self._on_forward_failure = on_forward_failure
        self.request_timeout_s = request_timeout_s

    async def embed(
        self,
        req: EmbeddingRequest,
        wait_disconnect: Callable[[], Awaitable[None]],
        timeout_s: float | None = None,
    ) -> EmbeddingResult:
        done = await self.compute(req, wait_disconnect, timeout_s)
        return EmbeddingResult(self._body(req, done), done.headers)

    def engine_errors(self) -> contextlib.AbstractContextManager[None]:
        """Engine exceptions -> HTTP statuses (as for embeddings), for the other routes."""
        return engine_errors(self._on_forward_failure)

    def schema_type(self, kind: str) -> str:
        return schema_type(kind, self.calibration)

    async def compute(
        self,
        req: EmbeddingRequest,
        wait_disconnect: Callable[[], Awaitable[None]],
        timeout_s: float | None = None,
    ) -> Computed:
        """Validate, tokenize, admit and run one request (every refusal before queueing);
        `timeout_s`: the caller's own deadline (X-Request-Timeout), if below --request-timeout."""
        start = time.perf_counter()
        if self.engine.config.task != "embed":
            raise ApiError(400, f"model {self.metadata.model!r} is a reranker: POST /v1/rerank")
        if req.model is not None and req.model != self.metadata.model:
            raise ApiError(
                404,
                f"model {clip(req.model)} not found; this server serves {self.metadata.model!r}",
                "not_found_error",
            )
        items = req.items
        if len(items) > self.max_inputs_per_request:
            raise ApiError(
                400, f"{len(items)} inputs in one request; the limit is {self.max_inputs_per_request}"
            )
        tokenize_start = time.perf_counter()
        with engine_errors(self._on_forward_failure):
            # Tokenizing a long document takes milliseconds: keep it off the event loop.
            tokenized = await asyncio.to_thread(self._tokenize, req)
        tokenize_time = time.perf_counter() - tokenize_start
        n_tokens = sum(len(t.token_ids) for t in tokenized)
        if not self.admission.fits_ever(len(tokenized), n_tokens):
            raise ApiError(
                413,
                f"request holds {len(tokenized)} inputs / {n_tokens} tokens; this server queues at most "
                f"{self.admission.max_inputs} inputs / {self.admission.max_tokens} tokens: split it",
            )
        ticket = self.admission.try_admit(len(tokenized), n_tokens)
        if ticket is None:
            retry = self.admission.retry_after()
            raise ApiError(
                429,
                f"server is at capacity ({self.admission.tokens} tokens queued); retry in {retry} s",
                "rate_limit_error",
                {"Retry-After": str(retry)},
            )
        try:
            with engine_errors(self._on_forward_failure):
                run = unless_disconnected(self._run(req, tokenized), wait_disconnect)
                outputs = await self.within_deadline(run, timeout_s)
        finally:
            self.admission.release(ticket)
        total = time.perf_counter() - start
        self.observe(outputs, tokenize_time, total)
        return Computed(tokenized, outputs, n_tokens, timing_headers(outputs, tokenize_time, total))

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

    def check_types(self, kinds: list[str], dimensions: int | None) -> None:
        """Refuse (400) a compressed type this server cannot produce at that width."""
        dim = dimensions or self.metadata.hidden_size
        if any(k in ("int8", "uint8") for k in kinds):
            try:
                self.calibration.ranges_for(dim)
            except ValueError as e:
                raise ApiError(400, f"int8/uint8 at {dim} dimensions: {e}") from None

    def _tokenize(self, req: EmbeddingRequest) -> list[Tokenized]:
        self.engine.check_dimensions(req.dimensions)
        self.check_types([req.embedding_type], req.dimensions)
        prompt = self.engine.resolve_prompt(req.prompt_name, req.prompt)
        return self.engine.tokenize(resolve_items(req.items), prompt, req.truncate)

    async def _run(self, req: EmbeddingRequest, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        # The records carry the ids with prompt and truncation applied, and the prompt's
        # length for pooling that excludes it: the engine does not tokenize again.
        return await self.engine.embed_tokenized_async(
            tokenized, dimensions=req.dimensions, normalize=req.normalize, priority=req.priority
        )

    def _body(self, req: EmbeddingRequest, done: Computed) -> dict[str, Any]:
        kind = req.embedding_type
        vectors: list[Any]
        if kind == "float":
            vectors = [encode_vector(o.embedding, req.encoding_format) for o in done.outputs]
        else:  # compressed (extension): ints, or their raw bytes in base64
            q = quantize(done.matrix(), kind, self.calibration)
            vectors = [to_base64(v) if req.encoding_format == "base64" else v.tolist() for v in q]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": vec,
                "num_tokens": out.num_tokens,
                "truncated": tok.truncated,
            }
            for i, (vec, out, tok) in enumerate(zip(vectors, done.outputs, done.tokenized, strict=True))
        ]
        n = done.n_tokens
        return {
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n},
            **self.metadata.fields(req.dimensions, req.normalize, self.schema_type(kind)),
        }

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
def engine_errors(on_forward_failure: Callable[[], None]) -> Iterator[None]:
    """Engine exceptions -> HTTP statuses. Bad input is the caller's fault; the rest is ours."""
    try:
        yield
    except ImageTooLargeError as e:
        raise ApiError(413, str(e)) from None
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
