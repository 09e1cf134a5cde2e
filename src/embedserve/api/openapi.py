"""What `/openapi.json` says about the server's and the gateway's routes, true to the handlers.

The embeddings route parses its body itself (api/protocol.py: 400 for bad JSON, 422 for a
wrong shape), so FastAPI cannot see a request model: the request body is declared here from
`EmbeddingRequest`'s own JSON schema, and every route lists the statuses it can answer with
the error body they carry and `Retry-After` where a retry can help.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, Field

from embedserve.api.openapi_multimodal import multimodal_inputs, with_messages
from embedserve.api.openapi_rules import LATE_CHUNKING, ONE_PROMPT, OPTIONS_NEED, SPANS
from embedserve.api.protocol import TOKEN_ID_SCHEMA, EmbeddingRequest

PROMETHEUS_TEXT = "text/plain"
DEADLINE_NOTE = (
    "Optional header `X-Request-Timeout: SECONDS` (a positive number): the caller waits no "
    "longer; the server uses the smaller of it and its --request-timeout (then 503 "
    "deadline_exceeded), a gateway the smaller of it and its request_timeout_s (then 504), whose "
    "time left it passes down to the pools. Not a number or not positive: 400."
)


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, "
                      "rate_limit_error, service_unavailable, deadline_exceeded (503 / 504: the "
                      "request's deadline passed; not worth re-sending elsewhere at once) or "
                      "server_error")  # fmt: skip
    param: None = None
    code: int = Field(description="the HTTP status")


class ErrorResponse(BaseModel):
    """The body of every non-200 answer (OpenAI's error shape)."""

    error: ErrorDetail


class SparseEmbedding(BaseModel):
    """A SPLADE model's vector (`embedding_type: sparse`): its non-zero term weights."""

    indices: list[int] = Field(description="vocabulary ids, ascending and unique")
    values: list[float] = Field(description="the weight of each id")
    tokens: list[str] | None = Field(default=None, description="each id's token (return_tokens)")


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int = Field(ge=0, description="position of the input (late chunking: of the chunk) in the request")
    embedding: list[float] | str | SparseEmbedding | list[list[float]] = Field(
        description="float list (compressed embedding types: integers), or base64 of little-endian "
        "float32 with encoding_format=base64 (compressed types too: their values as float32), or of "
        "the vector's own bytes with base64_bytes (one per int8 / uint8 value, one per 8 binary bits); "
        "a SPLADE model's sparse vector (embedding_type sparse) as indices and values; "
        "embedding_type multivector: a list of vectors, or base64 of the whole [vectors, dim] matrix"
    )
    shape: list[int] | None = Field(
        default=None, description="multivector: [vectors, dim] of the item's matrix (compressed: its bytes)"
    )
    num_tokens: int = Field(
        ge=1, description="tokens embedded (prompt included, after truncation; late chunking: the chunk's)"
    )
    truncated: bool = Field(default=False, description="the input (its document) was cut to its limit")
    char_range: list[int] | None = Field(
        default=None, description="late chunking: the chunk's [start, end) characters in the document"
    )
    token_range: list[int] | None = Field(
        default=None, description="late chunking: the chunk's [start, end) positions in the token sequence"
    )
    pool: str | None = Field(default=None, description="gateway only: the pool that embedded it")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    usage: Usage
    model: str
    model_version: str
    dtype: str
    backend_profile: str
    embedding_schema: str = Field(description="vectors with different schemas are not comparable")
    late_chunking: dict[str, int] | None = Field(
        default=None,
        description="late chunking: the document's num_tokens, the windows it ran as, their overlap_tokens",
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    model_version: str | None = None
    dtype: str | None = None
    backend_profile: str | None = None
    embedding_schema: str | None = None
    dimensions: int | None = None
    max_model_len: int | None = None
    pooling: str | None = None
    normalize: bool | None = None
    prompt_names: list[str] | None = None
    vocab_size: int | None = Field(default=None, description="token ids are below it")
    outputs: list[str] | None = Field(
        default=None, description="what the model emits: dense, sparse, multivector; images: it reads them"
    )
    multivector_dimensions: int | None = Field(
        default=None, description="a multi-vector model's vector width"
    )
    pools: dict[str, Any] | None = Field(default=None, description="gateway only: its pools' state")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Version(BaseModel):
    version: str = Field(description="embedserve's version (vLLM's `GET /version`)")


class Health(BaseModel):
    status: Literal["alive", "ready", "not_ready"]
    phase: str | None = Field(default=None, description="server: loading, warming_up, ready, ...")
    detail: str | None = None
    pools: dict[str, Any] | None = Field(default=None, description="gateway only: its pools' state")


_WHY = {
    400: "bad JSON, an invalid input (empty, unknown token id, too long with truncate=error, "
    "dimensions over the model's size, unknown prompt name), too many inputs, or an image that is "
    "not a PNG / JPEG / WebP data URI, cannot be decoded, comes in more than --max-images-per-input "
    "per input, or goes to a text-only model",
    401: "missing or wrong API key (only when the server has keys)",
    403: "gateway with tenants: the key's tenant may not use this model or traffic class",
    404: "the model named is not the one served",
    408: "the request body did not arrive in time",
    413: "body over the byte limit, more inputs / tokens than the server ever queues, or an image "
    "of more pixels than --max-image-pixels",
    422: "the body does not have the request's shape or types",
    429: "at capacity, or (gateway with tenants) the tenant is over a quota: retry after Retry-After seconds",
    500: "internal error (e.g. a forward pass failed); other requests are unaffected",
    502: "gateway: an upstream answered something invalid",
    503: "not ready (loading, draining, engine stopped) or no pool available (type "
    "service_unavailable), or the request was not answered within the server's --request-timeout "
    "or the caller's X-Request-Timeout header (seconds; type deadline_exceeded, its work "
    "cancelled); retry after Retry-After seconds",
    504: "gateway: its end-to-end deadline (request_timeout_s, or the client's X-Request-Timeout if "
    "shorter) passed or a pool's deadline 503 came "
    "back (type deadline_exceeded, not retried on another pool), or an upstream did not answer "
    "within timeout_s",
}
_RETRY = {429, 503}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` entries: each status with the error body, Retry-After where it applies."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorResponse, "description": _WHY[status]}
        if status in _RETRY:
            entry["headers"] = {
                "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer", "minimum": 1}}
            }
        out[status] = entry
    return out


def _ids(min_items: int) -> dict[str, Any]:
    return {"type": "array", "minItems": min_items, "items": TOKEN_ID_SCHEMA}


def input_schema(max_inputs: int) -> dict[str, Any]:
    """The four OpenAI input shapes, then the two with images, as `protocol._check_input` reads them."""
    text = {"type": "string", "minLength": 1}
    return {
        "description": "a string, a list of strings, a list of token ids (one tokenized input) or a "
        f"list of token-id lists; at most {max_inputs} inputs, token ids below the model's "
        "vocabulary size, each input within the model's max_model_len unless truncate is set. "
        "Multimodal models (Qwen3-VL) also take an image part, a content item ({content: [text and "
        "image parts]}) or a list of strings and such items; a text-only model answers an image with 400",
        "anyOf": [
            text,
            {"type": "array", "minItems": 1, "maxItems": max_inputs, "items": text},
            _ids(1),
            {"type": "array", "minItems": 1, "maxItems": max_inputs, "items": _ids(1)},
            *multimodal_inputs(max_inputs),
        ],
    }


def request_schema(max_inputs: int) -> dict[str, Any]:
    schema = copy.deepcopy(EmbeddingRequest.model_json_schema())
    schema["properties"]["input"] = input_schema(max_inputs)
    schema["properties"]["dimensions"]["description"] = "Matryoshka: keep the first N values (at most the "
    "model's hidden size), then normalize"
    schema["properties"]["user"]["description"] = "accepted and ignored (OpenAI compatibility)"
    schema["properties"]["chunk_spans"]["anyOf"][0] = {**SPANS, "maxItems": max_inputs}  # a chunk: an input
    schema["dependentSchemas"] = OPTIONS_NEED
    schema["allOf"] = [LATE_CHUNKING, ONE_PROMPT]
    return with_messages(schema)


def embeddings_route(max_inputs: int, statuses: tuple[int, ...]) -> dict[str, Any]:
    """Keyword arguments of the `POST /v1/embeddings` route decorator."""
    ms = {"schema": {"type": "string"}}
    return {
        "summary": "Embed one or more inputs",
        "description": DEADLINE_NOTE,
        "response_model": None,
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": request_schema(max_inputs)}},
            }
        },
        "responses": {
            200: {
                "model": EmbeddingResponse,
                "description": "one vector per input, in input order, with the vector-space metadata",
                "headers": {
                    f"x-{name}-time": {"description": "milliseconds", **ms}
                    for name in ("queue", "inference", "total")
                },
            },
            **error_responses(*statuses),
        },
    }


def metrics_route(*statuses: int) -> dict[str, Any]:
    return {
        "summary": "Prometheus metrics",
        "response_model": None,
        "responses": {
            200: {
                "description": "Prometheus text exposition format",
                "content": {PROMETHEUS_TEXT: {"schema": {"type": "string"}}},
            },
            **error_responses(*statuses),
        },
    }
