"""Wire format of the rerank API (`POST /v1/rerank`, `/rerank`, `/v2/rerank`): the shape Cohere,
Jina and vLLM share.

    request   {"model", "query", "documents": [str | {"text": str}], "top_n", "return_documents"}
              + extensions: "raw_scores" (the logit instead of sigmoid / P(yes)), "truncate"
              ("end" default, "start", "error"; only the document is cut), "instruction"
              (Qwen3-Reranker's task line), "priority"
    response  {"id", "results": [{"index", "relevance_score", "document": {"text"}?}] best first,
               "model", "usage": {"prompt_tokens", "total_tokens"}, + the embeddings metadata}
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from embedserve.api.protocol import Text, usage
from embedserve.errors import API_REMEDY, TEI_REMEDY


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    text: Text


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    query: Text
    documents: list[Text | RerankDocument] = Field(min_length=1)
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    raw_scores: bool = False
    truncate: Literal["end", "start", "error"] = "end"
    instruction: str | None = None
    priority: Literal["online", "batch"] = "online"
    # Parsed from TEI's body (`texts`, api/tei.py): answered in TEI's shape.
    _tei: bool = PrivateAttr(default=False)

    @property
    def tei(self) -> bool:
        return self._tei

    @property
    def truncate_remedy(self) -> str:
        return TEI_REMEDY if self._tei else API_REMEDY

    def as_tei(self) -> RerankRequest:
        self._tei = True
        return self

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


def rerank_body(
    req: RerankRequest, ranked: list[tuple[int, float]], n_tokens: int, metadata: dict[str, Any]
) -> dict[str, Any]:
    """`ranked`: (document index, score), best first."""
    texts = req.texts
    results = [
        {
            "index": i,
            "relevance_score": score,
            **({"document": {"text": texts[i]}} if req.return_documents else {}),
        }
        for i, score in ranked
    ]
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "usage": usage(n_tokens),
        **metadata,
    }
