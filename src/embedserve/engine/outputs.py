"""What one embedded input comes back as (`EmbeddingOutput`), made from the core's Finished."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from embedserve.engine.core import Finished
from embedserve.engine.loop import gather_all, wait_all
from embedserve.errors import InvalidInputError
from embedserve.request import Priority
from embedserve.tokenizer import Tokenized


@dataclass(frozen=True)
class EmbeddingOutput:
    embedding: np.ndarray  # float32 [dim]
    num_tokens: int
    truncated: bool
    queue_time: float  # seconds from submission to first scheduled step
    inference_time: float  # seconds from first scheduled step to finish
    num_preemptions: int = 0  # times this request was preempted and recomputed
    num_steps: int = 0  # engine steps that ran a chunk of it (recomputed ones included)
    num_lane_slices: int = 0  # layer-major lane slices that ran it (long prompts)
    finish_time: float = 0.0  # time.monotonic() when it finished (tracing places spans by it)


def wait_outputs(futures: list[Future[Finished]], tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
    """Each input's output once every request finished (`gather_outputs`, blocking)."""
    return [output_of(f, t) for f, t in zip(wait_all(futures), tokenized, strict=True)]


async def gather_outputs(
    futures: list[Future[Finished]], tokenized: list[Tokenized]
) -> list[EmbeddingOutput]:
    return [output_of(f, t) for f, t in zip(await gather_all(futures), tokenized, strict=True)]


def parse_priority(value: str) -> Priority:
    try:
        return Priority.parse(value)
    except ValueError as e:
        raise InvalidInputError(str(e)) from None


def timings(fin: Finished) -> tuple[float, float]:
    """(queue_time, inference_time) of a finished request, in seconds."""
    req = fin.request
    started = req.first_scheduled_time or fin.finish_time
    return started - req.arrival_time, fin.finish_time - started


def output_of(fin: Finished, tok: Tokenized) -> EmbeddingOutput:
    assert fin.vector is not None
    queue_time, inference_time = timings(fin)
    return EmbeddingOutput(
        embedding=fin.vector.numpy().astype(np.float32, copy=False),
        num_tokens=len(tok.token_ids),
        truncated=tok.truncated,
        queue_time=queue_time,
        inference_time=inference_time,
        num_preemptions=fin.request.num_preemptions,
        num_steps=fin.request.num_steps,
        num_lane_slices=fin.request.num_lane_slices,
        finish_time=fin.finish_time,
    )
