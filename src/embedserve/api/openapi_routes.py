"""`/openapi.json` for the POST routes beside `/v1/embeddings` (server and gateway): `/v2/embed`,
`/v1/rerank` (Cohere's and TEI's bodies), `/v1/score`, TEI's `/embed`, `/tokenize`,
`/detokenize`. Their request bodies come from the request models the handlers parse with
(api/cohere.py, api/rerank.py, api/tei.py, api/score.py, api/tokenize.py: 400 for bad JSON,
422 for a wrong shape), with their 200 bodies and the statuses the route answers."""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, Field, RootModel

from embedserve.api.classify import ClassifyRequest, PredictRequest
from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.openapi import DEADLINE_NOTE, Usage, error_responses
from embedserve.api.openapi_multimodal import CONTENT, ITEM
from embedserve.api.openapi_rules import COHERE_SPARSE_WIDTH, ONE_PROMPT
from embedserve.api.protocol import TEXT_SCHEMA
from embedserve.api.rerank import RerankRequest
from embedserve.api.score import ScoreRequest
from embedserve.api.tei import TeiEmbedRequest, TeiEmbedSparseRequest, TeiRerankRequest
from embedserve.api.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse


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


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResult] = Field(description="best first; top_n of them when set")
    usage: Usage
    model: str


class ScoreItem(BaseModel):
    index: int = Field(ge=0, description="position of the pair")
    object: Literal["score"]
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem] = Field(description="one score per pair, in pair order")
    usage: Usage


class ClassifyItem(BaseModel):
    index: int = Field(ge=0)
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ClassifyItem]
    usage: Usage


class TeiRerankResult(BaseModel):
    index: int = Field(ge=0)
    score: float
    text: str | None = Field(default=None, description="with return_text")


class RerankAnswer(RootModel[RerankResponse | list[TeiRerankResult]]):
    """Cohere's body, or TEI's list when the request had TEI's shape (`texts`)."""


class TeiToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int
    stop: int


class TokenizeAnswer(RootModel[TokenizeResponse | list[list[TeiToken]]]):
    """vLLM's body, or TEI's token lists when the request had TEI's shape (`inputs`)."""


class Prediction(BaseModel):
    score: float
    label: str


class Predictions(RootModel[list[Prediction] | list[list[Prediction]]]):
    """TEI's `/predict` answer: labels best first, per input for a batch."""


class Vectors(RootModel[list[list[float]]]):
    """TEI's `/embed` answer: one vector per input, in input order."""


class SparseValue(BaseModel):
    index: int = Field(ge=0, description="a vocabulary id")
    value: float


class SparseVectors(RootModel[list[list[SparseValue]]]):
    """TEI's `/embed_sparse` answer: per input, its non-zero term weights, indices ascending."""


def inlined_schema(model: type[BaseModel], max_items: int, field: str | None) -> dict[str, Any]:
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
    if field is not None:
        limited = out["properties"][field]
        for shape in limited.get("anyOf", [limited]):
            if shape.get("type") == "array":
                shape["maxItems"] = max_items
    return out


def route_doc(
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
    request = inlined_schema(CohereEmbedRequest, max_inputs, "texts")
    request["allOf"] = [COHERE_SPARSE_WIDTH]
    return route_doc("Embed texts (Cohere v2 embed API)", request, CohereEmbedResponse, statuses)


def rerank_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of the `POST /v1/rerank` routes (and aliases): Cohere's or TEI's body."""
    cohere = inlined_schema(RerankRequest, max_inputs, "documents")
    tei = inlined_schema(TeiRerankRequest, max_inputs, "texts")
    request = {"anyOf": [cohere, tei]}
    return route_doc(
        "Rank documents by relevance to a query (Cohere's or TEI's body)", request, RerankAnswer, statuses
    )


def score_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /v1/score` (vLLM's score API)."""
    request = inlined_schema(ScoreRequest, max_inputs, "text_2")
    request["allOf"] = [ONE_PROMPT]
    # text_1 and text_2 count together against the limit; N:N needs equal lengths (not JSON Schema's to say)
    for field, most in (("text_1", max(max_inputs // 2, 1)), ("text_2", max(max_inputs - 1, 1))):
        for shape in request["properties"][field]["anyOf"]:
            if shape.get("type") == "array":
                shape["maxItems"] = most
    return route_doc("Score text pairs (1:1, 1:N, N:N)", request, ScoreResponse, statuses)


def tei_embed_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /embed` (TEI's embed API)."""
    request = inlined_schema(TeiEmbedRequest, max_inputs, "inputs")
    return route_doc("Embed texts (Text Embeddings Inference's API)", request, Vectors, statuses)


def tei_embed_sparse_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /embed_sparse` (TEI's sparse embed API; SPLADE models)."""
    request = inlined_schema(TeiEmbedSparseRequest, max_inputs, "inputs")
    return route_doc("Sparse term weights of texts (SPLADE; TEI's API)", request, SparseVectors, statuses)


def tokenize_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /tokenize` (vLLM's body, or TEI's with `inputs`)."""
    request = inlined_schema(TokenizeRequest, max_inputs, "inputs")
    # `input`: one embeddings input (a text, a content item or its parts); exactly one source given
    request["properties"]["input"] = {"anyOf": [TEXT_SCHEMA, ITEM, CONTENT["anyOf"][1], {"type": "null"}]}
    given = ("prompt", "input", "inputs")
    request["oneOf"] = [{"required": [k], "properties": {k: {"not": {"type": "null"}}}} for k in given]
    # without special tokens: texts only (a multimodal model's /openapi.json says never)
    request["if"] = {
        "required": ["add_special_tokens"],
        "properties": {"add_special_tokens": {"const": False}},
    }
    request["then"] = {"properties": {"input": {"anyOf": [TEXT_SCHEMA, {"type": "null"}]}}}
    return route_doc(
        "Tokenize as the embedding routes count (vLLM's or TEI's body)", request, TokenizeAnswer, statuses
    )


def detokenize_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /detokenize` (vLLM's)."""
    request = inlined_schema(DetokenizeRequest, max_inputs, None)
    return route_doc("Token ids back to text", request, DetokenizeResponse, statuses)


def classify_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /classify` (vLLM's classify API)."""
    request = inlined_schema(ClassifyRequest, max_inputs, "input")
    return route_doc("Classify texts (a sequence-classification model)", request, ClassifyResponse, statuses)


def predict_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of `POST /predict` (TEI's classification API)."""
    request = inlined_schema(PredictRequest, max_inputs, None)
    for shape in request["properties"]["inputs"]["anyOf"]:  # the batch: its inputs count, not a pair's two
        if shape.get("items", {}).get("type") == "array":
            shape["maxItems"] = max_inputs
    return route_doc(
        "Classify texts or pairs (Text Embeddings Inference's API)", request, Predictions, statuses
    )
