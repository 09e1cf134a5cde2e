"""Reranking on the engine: (query, document) pairs run as ordinary requests (same batching,
token budget, chunking and preemption); their pooled rows go through the model's score head.

`RerankMixin` gives `Engine` its rerank methods (engine.py keeps the embedding API).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.engine.loop import gather_all, wait_all
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.models.registry import CLASSIFIER
from embedserve.models.score_head import ScoreHead
from embedserve.pairs import encode_cross_pair, encode_qwen3_pair
from embedserve.tokenizer import Tokenized, Truncate


@dataclass(frozen=True)
class RerankResult:
    index: int  # position in the documents passed
    relevance_score: float
    num_tokens: int  # of the pair as the model read it
    truncated: bool


class RerankMixin(EngineBase):
    def _head(self) -> ScoreHead:
        if self.score_head is None:
            raise InvalidInputError("this model is an embedding model: it cannot rerank")
        labels = self.score_head.num_labels
        if self.score_head.kind == CLASSIFIER and labels != 1:
            raise InvalidInputError(f"this model classifies into {labels} labels: it cannot rerank")
        return self.score_head

    def tokenize_pairs(
        self, query: str, documents: Sequence[str], truncate: str = "end", instruction: str | None = None
    ) -> list[Tokenized]:
        """Each (query, document) pair as the reranker reads it (pairs.py); all or nothing.
        `truncate`: "end" (default, as CrossEncoder), "start" or "error"; only the document
        is ever cut. `instruction`: Qwen3-Reranker's task line (default: its web-search one)."""
        head = self._head()
        policy = Truncate.parse(truncate)
        if isinstance(documents, str) or len(documents) == 0:
            raise InvalidInputError("documents must be a non-empty list of strings")
        limit = self.config.scheduler.max_model_len
        out = []
        for i, doc in enumerate(documents):
            try:
                if head.kind == "yes_no":
                    out.append(encode_qwen3_pair(self.tokenizer, query, doc, limit, policy, instruction))
                else:
                    types = self.config.model.type_vocab_size > 1
                    out.append(encode_cross_pair(self.tokenizer, query, doc, limit, policy, types))
            except InputTooLongError as e:
                raise InputTooLongError(e.num_tokens, e.limit, index=i) from None
            except InvalidInputError as e:
                raise InvalidInputError(f"document {i}: {e}") from None
        return out

    async def rerank_tokenized_async(
        self, tokenized: list[Tokenized], *, priority: str = "online"
    ) -> list[Finished]:
        """Run pairs that `tokenize_pairs` produced; returns their finished requests in order
        (scores via `scores()`)."""
        self._head()
        return await gather_all(self.submit_tokenized(tokenized, normalize=False, priority=priority))

    def scores(self, rows: torch.Tensor, raw_scores: bool = False) -> list[float]:
        """The head on pooled pair rows [n, hidden] -> one score each."""
        return [float(s) for s in self._head().scores(rows, raw_scores)]

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncate: str = "end",
        instruction: str | None = None,
        priority: str = "online",
    ) -> list[RerankResult]:
        """Score every document against the query; best first, the first `top_n` (all: None).
        Scores: sigmoid of a cross-encoder's logit (CrossEncoder.predict), P(yes) of a yes /
        no reranker; `raw_scores`: the logit (log-odds yes - no)."""
        check_top_n(top_n)
        tokenized = self.tokenize_pairs(query, documents, truncate, instruction)
        done = wait_all(self.submit_tokenized(tokenized, normalize=False, priority=priority))
        return ranked(self.scores(_rows(done), raw_scores), tokenized, top_n)

    async def rerank_async(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncate: str = "end",
        instruction: str | None = None,
        priority: str = "online",
    ) -> list[RerankResult]:
        """`rerank`, awaited; options as `rerank`."""
        check_top_n(top_n)
        tokenized = self.tokenize_pairs(query, documents, truncate, instruction)
        done = await self.rerank_tokenized_async(tokenized, priority=priority)
        return ranked(self.scores(_rows(done), raw_scores), tokenized, top_n)


def _rows(done: list[Finished]) -> torch.Tensor:
    return torch.stack([f.vector for f in done if f.vector is not None])  # [n, hidden]


def check_top_n(top_n: int | None) -> None:
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InvalidInputError(f"top_n must be an integer >= 1, got {top_n!r}")


def ranked(scores: list[float], tokenized: list[Tokenized], top_n: int | None) -> list[RerankResult]:
    check_top_n(top_n)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))  # ties: input order
    return [
        RerankResult(i, scores[i], len(tokenized[i].token_ids), tokenized[i].truncated) for i in order[:top_n]
    ]
