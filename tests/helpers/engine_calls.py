"""The engine's one path (prepare / submit / run with an `Ask`) spelled as the calls tests make
most: each function is `Engine.run` with the ask its name says, answers typed."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from embedserve.engine.ask import Ask, LateChunking, MultiVectorInput, Prepared, answers_as
from embedserve.engine.core import Finished
from embedserve.engine.engine import EmbeddingOutput, Engine, LateChunkOutput
from embedserve.pooling.outputs import Output
from embedserve.tokenizer import Tokenized
from embedserve.tokenizer.windows import LongPlan


def embed_outputs(engine: Engine, inputs: Any, **options: Any) -> list[EmbeddingOutput]:
    return answers_as(engine.run(inputs, Ask(**options)), EmbeddingOutput)


async def embed_outputs_async(engine: Engine, inputs: Any, **options: Any) -> list[EmbeddingOutput]:
    return answers_as(await engine.run_async(inputs, Ask(**options)), EmbeddingOutput)


def submit(engine: Engine, inputs: Any, **options: Any) -> tuple[list[Future[Finished]], list[Tokenized]]:
    prepared = engine.prepare(inputs, Ask(**options))
    return engine.submit(prepared), prepared.tokenized


async def embed_tokenized_async(
    engine: Engine, tokenized: list[Tokenized], **options: Any
) -> list[EmbeddingOutput]:
    return answers_as(await engine.run_async(Prepared(Ask(**options), tokenized)), EmbeddingOutput)


def tokenize(
    engine: Engine, inputs: Any, prompt: str = "", truncate: str = "error", max_len: int | None = None
) -> list[Tokenized]:
    return engine.renderer.text(inputs, prompt, truncate, max_len)


def embed_lexical(engine: Engine, inputs: Any, **options: Any) -> np.ndarray:
    return np.stack([o.embedding for o in embed_outputs(engine, inputs, output=Output.LEXICAL, **options)])


def tokenize_multivector(
    engine: Engine, inputs: Any, side: str = "document", **options: Any
) -> list[MultiVectorInput]:
    return engine.renderer.multivector(inputs, side, **options)


def submit_multivector(
    engine: Engine, items: list[MultiVectorInput], **options: Any
) -> list[Future[Finished]]:
    prepared = Prepared(Ask(Output.MULTIVECTOR, **options), [i.tokenized for i in items], sides=items)
    return engine.submit(prepared)


def embed_multivector(
    engine: Engine, inputs: Any, *, input_type: str = "document", **options: Any
) -> list[np.ndarray]:
    ask = Ask(Output.MULTIVECTOR, side=input_type, **options)
    return [o.embedding for o in answers_as(engine.run(inputs, ask), EmbeddingOutput)]


def _late(options: dict[str, Any]) -> LateChunking:
    names = ("chunk_spans", "chunk_size", "span_pooling", "long", "overlap")
    return LateChunking(**{n: options.pop(n) for n in names if n in options})


def plan_late(
    engine: Engine, document: str | Sequence[str], *, prompt: str = "", truncate: str = "error", **late: Any
) -> LongPlan:
    return engine.renderer.late(document, _late(late), prompt, truncate)


def tokenize_late(engine: Engine, document: str | Sequence[str], **options: Any) -> Tokenized:
    return plan_late(engine, document, **options).document


def embed_late(engine: Engine, document: str | Sequence[str], **options: Any) -> LateChunkOutput:
    ask = Ask(Output.SPANS, late=_late(options), **options)
    (out,) = answers_as(engine.run(document, ask), LateChunkOutput)
    return out
