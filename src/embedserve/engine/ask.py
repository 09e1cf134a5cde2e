"""What one call asks of the engine, frozen and resolved once (`Ask`: the output and its
options), and what it runs as (`Prepared`: the requests' tokens, made by `Engine.prepare`).

Every output goes the same way: `prepare` renders the inputs for the ask (tokenizer/render.py),
`submit` queues one request per prepared sequence, `run` / `run_async` wait and shape the
answers (engine/answers.py). The outputs (pooling/outputs.py):

    DENSE        one vector per input (a SPLADE model's sparse vector is its dense output)
    LEXICAL      BGE-M3's lexical weights per input
    MULTIVECTOR  a vector per kept token of each input, on the ask's `side`
    SPANS        one vector per chunk of one document (late chunking: the ask's `late`)
    SCORES       one relevance score per (query, document) pair (rerankers)
    LABELS       a probability per label of each input (classifiers)

DENSE with `extras` (LEXICAL, MULTIVECTOR) asks BGE-M3 for all its vectors from one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from embedserve.pooling.outputs import Output
from embedserve.tokenizer.core import Tokenized
from embedserve.tokenizer.late import LateChunking
from embedserve.tokenizer.render_sides import SIDES, MultiVectorInput
from embedserve.tokenizer.windows import LongPlan

__all__ = ["SIDES", "Ask", "LateChunking", "MultiVectorInput", "Prepared", "answers_as"]

T = TypeVar("T")


@dataclass(frozen=True)
class Ask:
    """One call's output and options; the defaults are a plain embedding's.

    - `prompt_name`: a prompt of the model's table (`config_sentence_transformers.json`), e.g.
      "query"; `prompt`: literal text put before each input instead (not both). Neither: the
      model's default prompt, if any. Token-id inputs take no prompt.
    - `dimensions`: keep the first `dimensions` values (Matryoshka), then normalize.
    - `normalize`: L2-normalize each vector; None is the model's pooling config.
    - `priority`: "online" (latency) or "batch" (throughput; yields to online work).
    - `truncate`: "error" (an input over the model's limit is refused), "end" or "start".
    - `side` (MULTIVECTOR): "query" or "document". `late` (SPANS): how the document is chunked.
    - `raw_scores` (SCORES, LABELS): logits instead of probabilities. `instruction` (SCORES):
      a yes / no reranker's task line.
    """

    output: Output = Output.DENSE
    prompt_name: str | None = None
    prompt: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    priority: str = "online"
    truncate: str = "error"
    side: str = "document"
    late: LateChunking = field(default_factory=LateChunking)
    extras: frozenset[Output] = frozenset()
    raw_scores: bool = False
    instruction: str | None = None


@dataclass(frozen=True)
class Prepared:
    """An ask's inputs, rendered: `tokenized` runs as one request each (what a server counts
    and admits); a multi-vector ask's `sides`, a late-chunked one's `plan` (its windows are
    `tokenized`)."""

    ask: Ask
    tokenized: list[Tokenized]
    sides: list[MultiVectorInput] | None = None
    plan: LongPlan | None = None


def answers_as(answers: Sequence[object], kind: type[T]) -> list[T]:
    """A run's answers as the type its ask's output gives (engine.py's `Answer`), checked."""
    out = [a for a in answers if isinstance(a, kind)]
    if len(out) != len(answers):
        raise TypeError(
            f"expected {kind.__name__} answers, got {sorted({type(a).__name__ for a in answers})}"
        )
    return out
