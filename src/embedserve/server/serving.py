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
from typing import Any

from embedserve.api.http import unless_disconnected
from embedserve.api.protocol import ApiError, EmbeddingRequest, clip, encode_vector
from embedserve.engine.engine import EmbeddingOutput, Engine
from embedserve.errors import EngineDeadError, InternalEngineError, InvalidInputError
from embedserve.lengths import bucket_of
from embedserve.schema import ModelMetadata
from embedserve.server.admission import Admission
from embedserve.server.metrics import ServerMetrics
from embedserve.tokenizer import Tokenized


@dataclass(frozen=True)
class EmbeddingResult:
    body: dict[str, Any]
    headers: dict[str, str]


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
    ) -> None:
        self.engine = engine
        self.metadata = metadata
        self.admission = admission
        self.metrics = metrics
        self.max_inputs_per_request = max_inputs_per_request
        self._on_forward_failure = on_forward_failure
        self.request_timeout_s = request_timeout_s

    async def embed(
        self, req: EmbeddingRequest, wait_disconnect: Callable[[], Awaitable[None]]
    ) -> EmbeddingResult:
        start = time.perf_counter()
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
        with _engine_errors(self._on_forward_failure):
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
            with _engine_errors(self._on_forward_failure):
                run = unless_disconnected(self._run(req, tokenized), wait_disconnect)
                outputs = await asyncio.wait_for(run, self.request_timeout_s)  # cancelling aborts it
        except asyncio.TimeoutError:
            wait = str(self.admission.retry_after())
            raise ApiError(
                503,
                f"request not answered within {self.request_timeout_s:g} s (queue and compute); "
                f"its work was cancelled: retry in {wait} s",
                "service_unavailable",
                {"Retry-After": wait},
            ) from None
        finally:
            self.admission.release(ticket)
        total = time.perf_counter() - start
        self._observe(outputs, tokenize_time, total)
        return EmbeddingResult(
            self._body(req, tokenized, outputs, n_tokens), _timing_headers(outputs, tokenize_time, total)
        )

    def _tokenize(self, req: EmbeddingRequest) -> list[Tokenized]:
        self.engine.check_dimensions(req.dimensions)
        prompt = self.engine.resolve_prompt(req.prompt_name, req.prompt)
        return self.engine.tokenize(req.items, prompt, req.truncate)

    async def _run(self, req: EmbeddingRequest, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        # The records carry the ids with prompt and truncation applied, and the prompt's
        # length for pooling that excludes it: the engine does not tokenize again.
        return await self.engine.embed_tokenized_async(
            tokenized, dimensions=req.dimensions, normalize=req.normalize, priority=req.priority
        )

    def _body(
        self, req: EmbeddingRequest, tokenized: list[Tokenized], outputs: list[EmbeddingOutput], n_tokens: int
    ) -> dict[str, Any]:
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode_vector(out.embedding, req.encoding_format),
                "num_tokens": out.num_tokens,
                "truncated": tok.truncated,
            }
            for i, (out, tok) in enumerate(zip(outputs, tokenized, strict=True))
        ]
        return {
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            **self.metadata.fields(req.dimensions, req.normalize),
        }

    def _observe(self, outputs: list[EmbeddingOutput], tokenize_time: float, total: float) -> None:
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
def _engine_errors(on_forward_failure: Callable[[], None]) -> Iterator[None]:
    """Engine exceptions -> HTTP statuses. Bad input is the caller's fault; the rest is ours."""
    try:
        yield
    except InvalidInputError as e:
        raise ApiError(400, str(e)) from None
    except EngineDeadError as e:
        raise ApiError(503, str(e), "service_unavailable", {"Retry-After": "2"}) from None
    except InternalEngineError as e:
        on_forward_failure()
        raise ApiError(500, f"the engine failed to compute this request: {e}", "server_error") from None


def _timing_headers(outputs: list[EmbeddingOutput], tokenize_time: float, total: float) -> dict[str, str]:
    """Milliseconds, TEI-style; a batch reports its slowest input's queue and inference time."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.2f}"

    return {
        "x-tokenization-time": ms(tokenize_time),
        "x-queue-time": ms(max(o.queue_time for o in outputs)),
        "x-inference-time": ms(max(o.inference_time for o in outputs)),
        "x-total-time": ms(total),
    }
