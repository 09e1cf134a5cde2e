"""What the request validators refuse across fields, as JSON Schema, for `/openapi.json`: a
request the document allows is one they accept (api/openapi_contract.py). `EmbeddingRequest`'s
mode options, late chunking's shapes, one instruction per request."""

from __future__ import annotations

from typing import Any

COHERE_SPARSE_WIDTH: dict[str, Any] = {  # no Matryoshka width for sparse vectors (below): Cohere's body
    "if": {
        "required": ["embedding_types"],
        "properties": {"embedding_types": {"items": {"const": "sparse"}}},
    },
    "then": {"properties": {"output_dimension": {"type": "null"}}},
}

# An instruction is a prompt_name or a prompt (its text), not both (a null is neither).
ONE_PROMPT: dict[str, Any] = {
    "not": {
        "required": ["prompt_name", "prompt"],
        "properties": {"prompt_name": {"type": "string"}, "prompt": {"type": "string"}},
    }
}


def _is(field: str, value: Any) -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"const": value}}}


# What `EmbeddingRequest`'s validators refuse, as JSON Schema: options apply with the mode they belong to ...
OPTIONS_NEED: dict[str, Any] = {
    **{f: _is("embedding_type", "multivector") for f in ("input_type", "multivector_dtype")},
    **{
        f: _is("late_chunking", True)
        for f in ("chunk_spans", "late_chunk_size", "span_pooling", "long_late_chunking")
    },
    # late_overlap (even null) belongs to late chunking; a number of it, to long late chunking
    "late_overlap": {
        "allOf": [
            _is("late_chunking", True),
            {"anyOf": [{"properties": {"late_overlap": {"type": "null"}}}, _is("long_late_chunking", True)]},
        ]
    },
    **{f: _is("embedding_type", "sparse") for f in ("sparse_top_k", "return_tokens")},
}
SPANS = {  # each [start, end) inside the document and after the one before it: the server's 400
    "type": "array",
    "minItems": 1,
    "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
}
# ... and late chunking takes a document with chunk_spans or late_chunk_size (one), or its chunks
# with neither; it pools dense vectors; a long document's windows embed it whole (no truncate).
_CUT = [{"required": ["chunk_spans"]}, {"required": ["late_chunk_size"]}]
_GIVEN = {"chunk_spans": {"type": "array"}, "late_chunk_size": {"type": "integer"}}  # not null
LATE_CHUNKING: dict[str, Any] = {
    "if": _is("late_chunking", True),
    "then": {
        "required": ["input"],
        "anyOf": [
            {"properties": {"input": {"type": "string"}, **_GIVEN}, "oneOf": _CUT},
            {"properties": {"input": {"type": "array", "items": {"type": "string"}}}, "not": {"anyOf": _CUT}},
        ],
        "properties": {"embedding_type": {"not": {"enum": ["multivector", "sparse"]}}},
        "if": _is("long_late_chunking", True),
        "then": {"properties": {"truncate": {"const": "error"}}},
    },
}
