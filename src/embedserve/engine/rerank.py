"""Reranking on the engine: (query, document) pairs (tokenizer/render.py's `pairs`) run as
ordinary requests (same batching, token budget, chunking and preemption); their pooled rows go
through the model's score head (`scored`), and `Engine.rerank` ranks them (`ranked`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from embedserve.engine.core import Finished
from embedserve.engine.outputs import EmbeddingOutput, output_of
from embedserve.errors import InvalidInputError
from embedserve.models.score_head import ScoreHead
from embedserve.tokenizer import Tokenized


@dataclass(frozen=True)
class RerankResult:
    index: int  # position in the documents passed
    relevance_score: float
    num_tokens: int  # of the pair as the model read it
    truncated: bool
    # the pair's pooled row with its timings (None: a score not from a reranker, e.g. MaxSim)
    output: EmbeddingOutput | None = field(default=None, repr=False, compare=False)


def scored(
    head: ScoreHead, done: list[Finished], tokenized: list[Tokenized], raw_scores: bool
) -> list[RerankResult]:
    """The score head on the finished pairs' pooled rows: one result each, in input order.
    Scores: sigmoid of a cross-encoder's logit (CrossEncoder.predict), P(yes) of a yes / no
    reranker; `raw_scores`: the logit (log-odds yes - no)."""
    scores = [float(s) for s in head.scores(_rows(done), raw_scores)]
    return [
        RerankResult(i, score, len(tok.token_ids), tok.truncated, output_of(fin, tok))
        for i, (score, fin, tok) in enumerate(zip(scores, done, tokenized, strict=True))
    ]


def _rows(done: list[Finished]) -> torch.Tensor:
    return torch.stack([f.vector for f in done if f.vector is not None])  # [n, hidden]


def check_top_n(top_n: int | None) -> None:
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InvalidInputError(f"top_n must be an integer >= 1, got {top_n!r}")


def ranked(results: list[RerankResult], top_n: int | None) -> list[RerankResult]:
    """Best first (ties: input order), the first `top_n` (all: None)."""
    check_top_n(top_n)
    return sorted(results, key=lambda r: (-r.relevance_score, r.index))[:top_n]
