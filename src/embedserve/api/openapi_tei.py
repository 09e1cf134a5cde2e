"""`/openapi.json` entries of TEI's `/similarity` and `/decode`, and of the paths whose body picks
the route (TEI's `POST /`, vLLM's `POST /invocations`: api/dispatch.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, RootModel

from embedserve.api.openapi import Usage
from embedserve.api.openapi_routes import inlined_schema, route_doc
from embedserve.api.tei_similarity import DecodeRequest, SimilarityRequest
from embedserve.api.token_outputs import EmbedAllRequest, PoolingRequest


class Similarities(RootModel[list[float]]):
    """TEI's `/similarity` answer: each sentence's cosine to the source sentence, in order."""


class Texts(RootModel[list[str]]):
    """TEI's `/decode` answer: one text per id list."""


class TokenVectors(RootModel[list[list[list[float]]]]):
    """TEI's `/embed_all` answer: per input, each token's vector."""


class PoolingItem(BaseModel):
    index: int = Field(ge=0)
    object: Literal["pooling"]
    data: list[float] | list[list[float]] = Field(description="embed: the vector; token_embed: one per token")


class PoolingResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[PoolingItem]
    usage: Usage


class AnyAnswer(RootModel[Any]):
    """The answer of the route the body picked."""


def similarity_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /similarity` (TEI's sentence-similarity API)."""
    request = inlined_schema(SimilarityRequest, max_inputs, None)
    request["properties"]["inputs"]["properties"]["sentences"]["maxItems"] = max(max_inputs - 1, 1)
    return route_doc("Cosine of sentences to a source sentence (TEI's API)", request, Similarities, statuses)


def decode_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /decode` (TEI's)."""
    request = inlined_schema(DecodeRequest, max_inputs, None)
    request["properties"]["ids"]["anyOf"][1]["maxItems"] = max_inputs  # id lists; one list is one input
    return route_doc("Token ids back to texts (TEI's API)", request, Texts, statuses)


def embed_all_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /embed_all` (TEI's)."""
    request = inlined_schema(EmbedAllRequest, max_inputs, "inputs")
    return route_doc("Every token's vector (TEI's API)", request, TokenVectors, statuses)


def pooling_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /pooling` (vLLM's)."""
    request = inlined_schema(PoolingRequest, max_inputs, "input")
    # token_embed answers raw token vectors: no Matryoshka width, no normalization
    request["if"] = {"required": ["task"], "properties": {"task": {"const": "token_embed"}}}
    request["then"] = {"properties": {"dimensions": {"type": "null"}, "normalize": {"enum": [False, None]}}}
    return route_doc("Pooled or per-token vectors (vLLM's pooling API)", request, PoolingResponse, statuses)


def dispatch_route(summary: str, requests: list[dict[str, Any]], statuses: tuple[int, ...]) -> dict[str, Any]:
    """A path answering any of `requests`' bodies, as the route it picks."""
    return route_doc(summary, {"anyOf": requests}, AnyAnswer, statuses)
