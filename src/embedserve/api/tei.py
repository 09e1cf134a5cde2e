"""Text Embeddings Inference's shapes, so a TEI client works unchanged (README.md lists them).

    POST /embed    {"inputs": str | [str], "truncate": bool, "truncation_direction":
                   "Right" | "Left", "normalize", "prompt_name", "dimensions"} -> [[float]]
                   (the work of /v1/embeddings: `to_embedding_request`)
    POST /rerank   {"query", "texts", "raw_scores", "return_text", "truncate",
                   "truncation_direction"} -> [{"index", "score", "text"?}] best first
                   (Cohere's body on the same path has `documents`: the body picks the shape)
    GET  /info     the model and the server's limits (`info`)

TEI's `truncate` is a bool (default false: an over-long input is refused); true cuts at the
end, or at the start with `truncation_direction: "Left"`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from embedserve.api.protocol import EmbeddingRequest, Text, Texts, parse_body
from embedserve.api.rerank import RerankRequest

Direction = Literal["Right", "Left", "right", "left"]


def policy(truncate: bool | None, direction: Direction) -> Literal["error", "end", "start"]:
    """TEI's truncate flag and direction as our over-long policy."""
    if not truncate:
        return "error"
    return "start" if direction.lower() == "left" else "end"


class TeiEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: Texts
    model: str | None = None  # not TEI's (it serves one model): checked as every route checks it
    truncate: bool | None = False
    truncation_direction: Direction = "Right"
    normalize: bool = True
    prompt_name: str | None = None
    dimensions: int | None = Field(default=None, ge=1)

    def to_embedding_request(self) -> EmbeddingRequest:
        return EmbeddingRequest(
            input=self.inputs,
            model=self.model,
            truncate=policy(self.truncate, self.truncation_direction),
            normalize=self.normalize,
            prompt_name=self.prompt_name,
            dimensions=self.dimensions,
        )


class TeiEmbedSparseRequest(BaseModel):
    """TEI's `/embed_sparse`: a SPLADE model's term weights per input."""

    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: Texts
    model: str | None = None
    truncate: bool | None = False
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None

    def to_embedding_request(self) -> EmbeddingRequest:
        return EmbeddingRequest(
            input=self.inputs,
            model=self.model,
            truncate=policy(self.truncate, self.truncation_direction),
            prompt_name=self.prompt_name,
            embedding_type="sparse",
        )


def sparse_vectors(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """A sparse `/v1/embeddings` answer as TEI's `/embed_sparse`: per input, `{index, value}`
    for each non-zero weight, indices ascending."""
    return [
        [{"index": i, "value": v} for i, v in zip(e["indices"], e["values"], strict=True)]
        for e in embed_vectors(body)
    ]


class TeiRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    query: Text
    texts: list[Text] = Field(min_length=1)
    model: str | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = False
    truncation_direction: Direction = "Right"

    def to_rerank_request(self) -> RerankRequest:
        return RerankRequest(
            query=self.query,
            documents=list(self.texts),
            model=self.model,
            raw_scores=self.raw_scores,
            return_documents=self.return_text,
            truncate=policy(self.truncate, self.truncation_direction),
        ).as_tei()


def parse_rerank(body: bytes) -> RerankRequest:
    """Cohere's rerank body, or TEI's (`texts` without `documents`) as the same request, marked
    so its answer takes TEI's shape."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raw = None  # parse_body names the JSON error
    if isinstance(raw, dict) and "texts" in raw and "documents" not in raw:
        return parse_body(TeiRerankRequest, body).to_rerank_request()
    return parse_body(RerankRequest, body)


def tei_rerank_body(req: RerankRequest, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A rerank answer (Cohere's shape) as TEI's: [{index, score, text?}] best first."""
    texts = req.texts
    return [
        {
            "index": r["index"],
            "score": r["relevance_score"],
            **({"text": texts[r["index"]]} if req.return_documents else {}),
        }
        for r in body["results"]
    ]


def embed_vectors(body: dict[str, Any]) -> list[Any]:
    """A `/v1/embeddings` answer (float vectors) as TEI's: the vectors in input order."""
    data = sorted(body["data"], key=lambda d: d["index"])
    return [d["embedding"] for d in data]


class TeiInfo(BaseModel):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    tokenization_workers: int
    version: str


def info(
    card: dict[str, Any],
    model_type: dict[str, Any],
    max_batch_tokens: int,
    max_client_batch_size: int,
    max_concurrent_requests: int,
) -> dict[str, Any]:
    """TEI's `GET /info` body from a `/v1/models` card (id, model_version, dtype, max_model_len)."""
    from embedserve import __version__

    return TeiInfo(
        model_id=str(card["id"]),
        model_sha=card.get("model_version"),
        model_dtype=str(card.get("dtype", "")),
        model_type=model_type,
        max_concurrent_requests=max_concurrent_requests,
        max_input_length=int(card.get("max_model_len", 0)),
        max_batch_tokens=max_batch_tokens,
        max_batch_requests=None,
        max_client_batch_size=max_client_batch_size,
        tokenization_workers=1,
        version=__version__,
    ).model_dump()


_TEI_POOLING = {"lasttoken": "last_token"}


def model_type(task: str, pooling: str, labels: Sequence[str] = ()) -> dict[str, Any]:
    """TEI's `model_type`: {"embedding": {"pooling"}}, {"reranker": {"id2label"}} or
    {"classifier": {"id2label"}}."""
    if task == "embed":
        return {"embedding": {"pooling": _TEI_POOLING.get(pooling, pooling)}}
    kind = "reranker" if task == "rerank" else "classifier"
    return {kind: {"id2label": {str(i): label for i, label in enumerate(labels or ["LABEL_0"])}}}
