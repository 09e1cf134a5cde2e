"""`/openapi.json` for `POST /v2/embed` and `POST /v1/rerank` (server and gateway): their request
bodies from the request models the handlers parse with (api/cohere.py, api/rerank.py: 400 for
bad JSON, 422 for a wrong shape), their 200 bodies, and the statuses the route answers."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, Field

from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.openapi import DEADLINE_NOTE, error_responses
from embedserve.api.rerank import RerankRequest


class CohereMeta(BaseModel):
    api_version: dict[str, str]
    billed_units: dict[str, int]


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_by_type"]
    embeddings: dict[str, list[Any]] = Field(
        description="one list per requested embedding type, one vector per text, in text order"
    )
    texts: list[str]
    meta: CohereMeta
    model: str
    embedding_schemas: dict[str, str] = Field(description="the vector-space schema of each type")


class RerankResult(BaseModel):
    index: int = Field(ge=0, description="position of the document in the request")
    relevance_score: float
    document: dict[str, str] | None = Field(default=None, description="with return_documents")


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResult] = Field(description="best first; top_n of them when set")
    usage: RerankUsage
    model: str


def _inlined(model: type[BaseModel], max_items: int, field: str) -> dict[str, Any]:
    """The model's JSON schema with its `$defs` inlined (the document has no `#/$defs`) and the
    server's per-request limit on `field`."""
    schema = copy.deepcopy(model.model_json_schema())
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(copy.deepcopy(defs[ref.removeprefix("#/$defs/")]))
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    out: dict[str, Any] = inline(schema)
    out["properties"][field]["maxItems"] = max_items
    return out


def _route(
    summary: str, request: dict[str, Any], response: type[BaseModel], statuses: tuple[int, ...]
) -> dict[str, Any]:
    return {
        "summary": summary,
        "description": DEADLINE_NOTE,
        "response_model": None,
        "openapi_extra": {
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}}
        },
        "responses": {200: {"model": response, "description": "the answer"}, **error_responses(*statuses)},
    }


def cohere_embed_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of the `POST /v2/embed` route (Cohere's embed v2)."""
    request = _inlined(CohereEmbedRequest, max_inputs, "texts")
    return _route("Embed texts (Cohere v2 embed API)", request, CohereEmbedResponse, statuses)


def rerank_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of the `POST /v1/rerank` routes (and aliases)."""
    request = _inlined(RerankRequest, max_inputs, "documents")
    return _route("Rank documents by relevance to a query", request, RerankResponse, statuses)
