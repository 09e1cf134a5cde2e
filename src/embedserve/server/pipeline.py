"""The template every POST route of the server runs on: a route supplies its request's own parts
(a `Job`: tokenize, run on the engine, build the body); the stages below run once for all.

    parse -> task -> model -> input limit -> tokenize (off the loop) -> 413 -> 429 -> run
    (deadline, disconnect) -> metrics -> body + timing headers

Order matters: everything that can refuse a request (wrong task, unknown model, bad input, too
long, over the queue bound) runs before anything is queued in the engine, so a refused request
costs no engine work and an admitted one is admitted whole. Engine exceptions become statuses
in one place (`engine_errors`), and every route's refusals read the same.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

import numpy as np

from embedserve.api.http import unless_disconnected
from embedserve.api.protocol import ApiError
from embedserve.api.refusals import body_priority, model_not_found, too_many_inputs
from embedserve.api.routes import Req, Route, wrong_task
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.errors import API_REMEDY
from embedserve.server.admission import Ticket
from embedserve.server.serving import EmbeddingService, engine_errors, timing_headers
from embedserve.tokenizer import Tokenized

if TYPE_CHECKING:
    from embedserve.tracing.otel import RequestSpan

Answer = tuple[Any, dict[str, str]]  # (response body: an object, or a list in TEI's shapes; headers)


@dataclass(frozen=True)
class Computed:
    """One request's engine outputs before its route puts them in a response body."""

    tokenized: list[Tokenized]
    outputs: list[EmbeddingOutput]
    n_tokens: int

    def matrix(self) -> np.ndarray:
        return np.stack([o.embedding for o in self.outputs])  # float32 [n, dim]


class Job(ABC):
    """One parsed request of a route: what only the route knows. `tokenize` runs in a worker
    thread and may refuse (InvalidInputError, ApiError); `run` is cancelled on disconnect or
    deadline; `body` gets the outputs in input order. A job that `computes` nothing (tokenize)
    is answered from its tokens: no admission, no engine work."""

    computes = True

    @property
    def truncate_remedy(self) -> str:
        """How this route's body asks to cut an over-long input (errors.py: its 400's hint)."""
        return API_REMEDY

    def serves(self, task: str) -> bool:
        """A task beyond its route's that this job serves (a multi-vector model's MaxSim rerank)."""
        return False

    def __init__(self, model: str | None, n_inputs: int) -> None:
        self.model = model  # the request's `model` field
        self.n_inputs = n_inputs  # inputs before tokenizing (the per-request limit)

    @abstractmethod
    def tokenize(self) -> list[Tokenized]: ...

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        raise NotImplementedError(f"{type(self).__name__} computes nothing")

    @abstractmethod
    def body(self, done: Computed) -> Any: ...


@dataclass(frozen=True)
class ServerRoute(Generic[Req]):
    """A declared route (api/routes.py) bound to the server: its request -> its Job."""

    route: Route[Req]
    job: Callable[[EmbeddingService, Req], Job]


async def answer(
    svc: EmbeddingService,
    bound: ServerRoute[Any],
    body: bytes,
    wait_disconnect: Callable[[], Awaitable[None]],
    timeout_s: float | None = None,
    trace: RequestSpan | None = None,
) -> Answer:
    """One request body on a route, as the server answers it (also a Ray replica's handler);
    `timeout_s`: the caller's own deadline (X-Request-Timeout), if below --request-timeout;
    `trace`: the request's span when tracing is on (server/routes.py)."""
    route = bound.route
    req = route.parse(body)
    svc, job = bind(svc, bound, req)
    start = time.perf_counter()
    check_request(svc, route, job)
    with engine_errors(svc.on_forward_failure, job.truncate_remedy):
        # Tokenizing a long document takes milliseconds: keep it off the event loop.
        tokenized = await asyncio.to_thread(job.tokenize)
    tokenize_time = time.perf_counter() - start
    n_tokens = sum(len(t.token_ids) for t in tokenized)
    if not job.computes:
        return job.body(Computed(tokenized, [], n_tokens)), {}
    ticket = admit(svc, len(tokenized), n_tokens)
    try:
        with engine_errors(svc.on_forward_failure, job.truncate_remedy):
            run = unless_disconnected(job.run(tokenized), wait_disconnect)
            outputs = await svc.within_deadline(run, timeout_s)
    finally:
        svc.admission.release(ticket)
    total = time.perf_counter() - start
    reply = job.body(Computed(tokenized, outputs, n_tokens))  # may still fail (a reranker's scores)
    svc.observe(outputs, tokenize_time, total)
    if trace is not None:  # its tokenize / queue / engine spans, after the fact (tracing/otel.py)
        model = job.model or svc.metadata.model
        trace.answered(outputs, n_tokens, start, tokenize_time, total, model, body_priority(req)[0])
    return reply, timing_headers(outputs, tokenize_time, total)


def bind(svc: EmbeddingService, bound: ServerRoute[Any], req: Any) -> tuple[EmbeddingService, Job]:
    """The request's Job on the service its `model` names: a LoRA adapter's, else `svc` (whose
    checks then refuse a name it does not serve)."""
    job = bound.job(svc, req)
    if job.model is not None and job.model in svc.served_names()[1:]:
        svc = svc.serving(job.model)
        job = bound.job(svc, req)
    return svc, job


def check_request(svc: EmbeddingService, route: Route[Any], job: Job) -> None:
    """The refusals before tokenizing: the model's task, the `model` field, the input limit."""
    meta = svc.metadata
    task = svc.engine.config.task
    if task not in route.tasks and not job.serves(task):
        raise ApiError(400, wrong_task(meta.model, task))
    if job.model is not None and job.model != meta.model:
        raise model_not_found(job.model, ", ".join(svc.served_names()))
    limit = svc.max_inputs_per_request
    if job.n_inputs > limit:
        raise too_many_inputs(job.n_inputs, limit)


def admit(svc: EmbeddingService, n_inputs: int, n_tokens: int) -> Ticket:
    """The admission ticket; 413 when the request could never fit, 429 + Retry-After when the
    queue is full now."""
    admission = svc.admission
    if not admission.fits_ever(n_inputs, n_tokens):
        raise ApiError(
            413,
            f"request holds {n_inputs} inputs / {n_tokens} tokens; this server queues at most "
            f"{admission.max_inputs} inputs / {admission.max_tokens} tokens: split it",
        )
    ticket = admission.try_admit(n_inputs, n_tokens)
    if ticket is None:
        retry = admission.retry_after()
        raise ApiError(
            429,
            f"server is at capacity ({admission.tokens} tokens queued); retry in {retry} s",
            "rate_limit_error",
            {"Retry-After": str(retry)},
        )
    return ticket
