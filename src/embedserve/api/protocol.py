"""Wire format of the OpenAI-compatible embeddings API, plus our optional extensions.

Requests are parsed from raw bytes (not through FastAPI's body binding) so that every way a
body can be wrong maps to one clear status: bad JSON -> 400, wrong shape/type -> 422.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from embedserve.api.multimodal import Item, is_multimodal_item, messages_to_input, parse_item
from embedserve.api.quantize import EmbeddingType

# After validation: one string, several strings, or several token-id lists (a flat id list,
# which OpenAI reads as one tokenized input, becomes a one-item list of lists); with image or
# content items (api/multimodal.py), a list of strings and part lists.
EmbeddingInput = str | list[str] | list[list[int]] | list[Item]

_INPUT_SHAPES = "a string, a list of strings, a list of token ids or a list of token-id lists"

# A text the tokenizer reads: `/openapi.json` says it is never empty (the tokenizer refuses "" with
# a 400 naming the input: that check, not the parser's, answers it). Texts: one, or a list of
# them the parser refuses empty; TextOrList: the same document, the route's validator answers.
TEXT_SCHEMA = {"type": "string", "minLength": 1}
# A token id: a served model's `/openapi.json` caps it below its vocabulary (api/openapi_contract.py);
# the tokenizer answers one outside it with a 400 naming it.
TOKEN_ID_SCHEMA = {"title": "TokenId", "type": "integer", "minimum": 0}
TokenId = Annotated[int, WithJsonSchema(TOKEN_ID_SCHEMA)]
Text = Annotated[str, WithJsonSchema(TEXT_SCHEMA)]
Texts = Text | Annotated[list[Text], Field(min_length=1)]
TextOrList = Annotated[
    str | list[str],
    WithJsonSchema({"anyOf": [TEXT_SCHEMA, {"type": "array", "items": TEXT_SCHEMA, "minItems": 1}]}),
]


class ApiError(Exception):
    """An error the API answers with `status` and an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.status)


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def usage(n_tokens: int) -> dict[str, int]:
    """The `usage` object of every answer that bills input tokens."""
    return {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


def listed(kind: str, data: list[dict[str, Any]], n_tokens: int, metadata: dict[str, Any]) -> dict[str, Any]:
    """vLLM's list answer (`/v1/score`, `/classify`): an id of `kind`, `data`, usage, metadata."""
    return {
        "id": f"{kind}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "data": data,
        "usage": usage(n_tokens),
        **metadata,
    }


def clip(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters: error messages never echo a whole input back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} chars)"


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_input(value: object) -> EmbeddingInput:
    """Accept exactly the four OpenAI input shapes; empty inputs pass (the engine names them)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # one image or content item
        return _check_input([value])
    if not isinstance(value, list):
        raise ValueError(f"input must be {_INPUT_SHAPES}; got {type(value).__name__}")
    if not value:
        return []
    if all(isinstance(x, str) for x in value):
        return list(value)
    if any(is_multimodal_item(x) for x in value):
        items: list[Item] = []
        for i, x in enumerate(value):
            if not isinstance(x, (str, dict)):
                raise ValueError(f"input[{i}]: with content items, each input is a string or an object")
            try:
                items.append(x if isinstance(x, str) else parse_item(x))
            except ValueError as e:
                raise ValueError(f"input[{i}]: {e}") from None
        return items
    if all(_is_id(x) for x in value):
        return [list(value)]
    if all(isinstance(x, list) for x in value):
        for i, ids in enumerate(value):
            bad = next((x for x in ids if not _is_id(x)), None)
            if bad is not None:
                raise ValueError(f"input[{i}] must be a list of integer token ids; found {clip(bad)}")
        return [list(ids) for ids in value]
    kinds = sorted({type(x).__name__ for x in value})
    raise ValueError(f"input must be {_INPUT_SHAPES}, not a mix of {', '.join(kinds)}")


class EmbeddingRequest(BaseModel):
    # Unknown fields are refused: a typo such as "dimension" must not be silently ignored.
    model_config = ConfigDict(extra="forbid", strict=True)

    input: EmbeddingInput
    model: str | None = None
    # base64: OpenAI's little-endian float32, for every embedding_type (an int8 or binary
    # vector's values are exact in float32), as the openai client decodes it by default;
    # base64_bytes (extension): the vector's own bytes, one per value or per 8 bits
    encoding_format: Literal["float", "base64", "base64_bytes"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # Extensions (optional; absent means the model's own defaults).
    prompt_name: str | None = None
    prompt: str | None = None
    normalize: bool | None = None
    priority: Literal["online", "batch"] = "online"
    truncate: Literal["error", "end", "start"] = "error"
    # compressed (api/quantize.py), sparse, or multivector (a vector per token: server/multivector_routes.py)
    embedding_type: EmbeddingType | Literal["sparse", "multivector"] = "float"
    input_type: Literal["query", "document"] | None = Field(
        default=None, description="multivector: the side each input is encoded as (default document)"
    )
    multivector_dtype: EmbeddingType = Field(
        default="float", description="multivector: each vector's type (float or compressed)"
    )
    sparse_top_k: int | None = Field(default=None, ge=1)  # sparse: only the k largest weights
    return_tokens: bool = False  # sparse: the token of each index too
    # Late chunking (tokenizer/late.py): `input` is one document's chunks, or the document with
    # `chunk_spans` ([start, end) characters) or `late_chunk_size` (tokens per chunk).
    late_chunking: bool = Field(
        default=False, description="input is one document: its chunks in order, or the whole text"
    )
    chunk_spans: list[list[int]] | None = Field(
        default=None, description="late chunking: the chunks as [start, end) characters of the document"
    )
    late_chunk_size: int | None = Field(default=None, ge=1, description="late chunking: tokens per chunk")
    span_pooling: Literal["mean", "last"] = Field(
        default="mean", description="late chunking: each chunk's mean, or its last row (causal decoders)"
    )
    long_late_chunking: bool = Field(
        default=False, description="late chunking: a document over max_model_len as overlapping windows"
    )
    late_overlap: int | None = Field(
        default=None, ge=0, description="long late chunking: tokens windows share (default max_model_len / 8)"
    )

    _validate_input = field_validator("input", mode="plain")(_check_input)

    @model_validator(mode="before")
    @classmethod
    def _messages(cls, data: Any) -> Any:
        """vLLM's chat-embedding body (`messages`) as one input (api/multimodal.py)."""
        return messages_to_input(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _multivector_options(self) -> EmbeddingRequest:
        given = [f for f in ("input_type", "multivector_dtype") if f in self.model_fields_set]
        if self.embedding_type != "multivector" and given:
            raise ValueError(f"{', '.join(given)} applies with embedding_type 'multivector'")
        if self.embedding_type == "multivector" and self.late_chunking:
            raise ValueError("late_chunking pools chunks into one vector each; multivector keeps every token")
        return self

    @model_validator(mode="after")
    def _late_options(self) -> EmbeddingRequest:
        late = ("chunk_spans", "late_chunk_size", "span_pooling", "long_late_chunking", "late_overlap")
        given = [f for f in late if f in self.model_fields_set]
        if not self.late_chunking:
            if given:
                raise ValueError(f"{', '.join(given)} applies with late_chunking: true")
            return self
        if not (isinstance(self.input, str) or all(isinstance(x, str) for x in self.input)):
            raise ValueError("late_chunking takes text: a document's chunks, or the document")
        whole = [f for f in late[:2] if f in given]
        if isinstance(self.input, str) and len(whole) != 1:
            raise ValueError(
                "late_chunking on one document string takes chunk_spans or late_chunk_size (one)"
            )
        if not isinstance(self.input, str) and whole:
            raise ValueError(f"{whole[0]} goes with input as one document string, not a list of chunks")
        if self.embedding_type == "sparse":
            raise ValueError("late_chunking pools dense vectors; embedding_type 'sparse' does not apply")
        if self.late_overlap is not None and not self.long_late_chunking:
            raise ValueError("late_overlap applies with long_late_chunking: true")
        if self.long_late_chunking and self.truncate != "error":
            raise ValueError("long_late_chunking embeds the whole document: truncate does not apply")
        return self

    @property
    def n_outputs(self) -> int | None:
        """Vectors the answer will hold where known before tokenizing (late chunking by size: not)."""
        if not self.late_chunking:
            return len(self.items)
        if self.chunk_spans is not None:
            return len(self.chunk_spans)
        return None if isinstance(self.input, str) else len(self.input)

    @property
    def items(self) -> list[str] | list[list[int]] | list[Item]:
        return [self.input] if isinstance(self.input, str) else self.input


M = TypeVar("M", bound=BaseModel)


def parse_request(body: bytes) -> EmbeddingRequest:
    return parse_body(EmbeddingRequest, body)


def parse_body(model: type[M], body: bytes) -> M:
    """A request body as `model` (every route's): 400 when it is not JSON, 422 naming each
    field that is wrong. A number with no fraction (5.0) is an integer, as JSON Schema reads it."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
    if any(err["type"] == "json_invalid" for err in errors):
        raise ApiError(400, f"request body is not valid JSON: {errors[0]['msg']}")
    if any(c in body for c in b".eE"):  # JSON Schema's integers include 5.0: read them as integers
        try:
            data, integral = _integral_numbers(body)
        except (ValueError, RecursionError):  # e.g. an integer literal past Python's digit limit
            integral = False
        if integral:
            try:
                return model.model_validate_json(json.dumps(data))
            except ValidationError as e:
                errors = e.errors(include_url=False)
    raise ApiError(422, describe_validation_errors(errors))


def _integral_numbers(body: bytes) -> tuple[Any, bool]:
    """The body with each number that has no fraction (5.0, 1e3) as an int, and whether any had one."""
    seen = False

    def number(literal: str) -> int | float:
        nonlocal seen
        value = float(literal)
        if not value.is_integer():
            return value
        seen = True
        return int(value)

    return json.loads(body, parse_float=number), seen


def describe_validation_errors(errors: list[Any]) -> str:
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "invalid request: " + "; ".join(parts)


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A float vector as JSON floats or base64 of its little-endian float32 (base64_bytes: the
    same bytes). The OpenAI client decodes base64 as little-endian float32."""
    if encoding_format in ("base64", "base64_bytes"):
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32, copy=False).tolist()
