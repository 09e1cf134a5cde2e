"""Wire format of `POST /v1/score` (also `/score`): vLLM's shape.

    request   {"model", "text_1": str | [str], "text_2": str | [str]}: 1:1, 1:N (one text_1
              against every text_2) or N:N (pairs in order)
              + "prompt_name" / "prompt" (an embedding model's prompt, as /v1/embeddings takes
              it: none unless given), "truncate", "raw_scores" and "instruction" (a reranker's,
              as /v1/rerank takes them), "priority"
    response  {"id", "object": "list", "created", "model", "data": [{"index", "object": "score",
              "score"}] in pair order, "usage", + the embeddings metadata}

An embedding model scores a pair by the cosine of the two vectors `/v1/embeddings` returns for
them (float64); a reranker (cross-encoder, Qwen3-Reranker) as `/v1/rerank` scores the pair.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from embedserve.api.protocol import TextOrList, listed


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    text_1: TextOrList
    text_2: TextOrList
    model: str | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    # None: each model kind's own default (/v1/embeddings: "error"; /v1/rerank: "end").
    truncate: Literal["error", "end", "start"] | None = None
    raw_scores: bool = False
    instruction: str | None = None
    priority: Literal["online", "batch"] = "online"

    @model_validator(mode="after")
    def _shape(self) -> ScoreRequest:
        n1, n2 = len(self.left), len(self.right)
        if n1 == 0 or n2 == 0:
            raise ValueError("text_1 and text_2 each need at least one text")
        if n1 != 1 and n1 != n2:
            raise ValueError(
                f"text_1 holds {n1} texts and text_2 {n2}: give one text_1 (1:N) or as many as text_2 (N:N)"
            )
        return self

    @property
    def left(self) -> list[str]:
        return [self.text_1] if isinstance(self.text_1, str) else self.text_1

    @property
    def right(self) -> list[str]:
        return [self.text_2] if isinstance(self.text_2, str) else self.text_2

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """(index in `left`, index in `right`) of each scored pair, in answer order."""
        one = len(self.left) == 1
        return [(0 if one else j, j) for j in range(len(self.right))]


def cosines(left: np.ndarray, right: np.ndarray, pairs: list[tuple[int, int]]) -> list[float]:
    """Cosine of each pair of rows, in float64 (whether or not the rows are normalized)."""
    a = left.astype(np.float64)[[i for i, _ in pairs]]
    b = right.astype(np.float64)[[j for _, j in pairs]]
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return [float(x) for x in (a * b).sum(axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)]


def score_body(scores: list[float], n_tokens: int, metadata: dict[str, Any]) -> dict[str, Any]:
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    return listed("score", data, n_tokens, metadata)
