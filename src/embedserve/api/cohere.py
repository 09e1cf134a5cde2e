"""Cohere's v2 embed API (`POST /v2/embed`): request model, input_type -> prompt, response body.

    request   {"model", "texts", "input_type", "embedding_types", "output_dimension", "truncate"}
    response  {"id", "response_type": "embeddings_by_type", "texts",
               "embeddings": {"float": [[...]], "int8": [[...]], ...,
                              "sparse": [{"indices": [...], "values": [...]}, ...]},
               "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": n}}}
              + our metadata (model, model_version, dtype, backend_profile, embedding_schema of
              the float vectors, and "embedding_schemas": one per returned type)

`input_type` picks a prompt from the model's prompt table (config_sentence_transformers.json),
the first of these names that the table defines (in any case), else no prompt at all:

    search_query -> query            search_document -> document, passage
    classification -> classification clustering -> clustering

`truncate`: NONE refuses an over-long text (400), START / END cut that end of the text.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from embedserve.api.protocol import EmbeddingRequest, Text
from embedserve.api.quantize import Calibration, quantize, to_base64
from embedserve.api.sparse import sparse_item

# "sparse" (ours): a SPLADE model's vectors as {"indices", "values"} (api/sparse.py), alone;
# "multivector" (ours): a multi-vector model's vectors per text (a list of float lists)
CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64", "sparse", "multivector"]
InputType = Literal["search_query", "search_document", "classification", "clustering"]

PROMPT_NAMES: dict[str, tuple[str, ...]] = {
    "search_query": ("query",),
    "search_document": ("document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
_TRUNCATE = {"NONE": "error", "START": "start", "END": "end"}


def _float_only() -> list[CohereType]:
    return ["float"]


class CohereEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    texts: list[Text] = Field(min_length=1)
    model: str | None = None
    input_type: InputType | None = None
    embedding_types: list[CohereType] = Field(default_factory=_float_only, min_length=1)
    output_dimension: int | None = Field(default=None, ge=1)
    truncate: Literal["NONE", "START", "END"] = "END"

    def to_embedding_request(self, prompts: Mapping[str, str]) -> EmbeddingRequest:
        """The same work as an OpenAI-style request (prompt from input_type, truncation)."""
        name = None
        if self.input_type is not None:
            # names compare without case: EmbeddingGemma's table says "Classification", "Clustering"
            wanted = PROMPT_NAMES[self.input_type]
            name = next((k for n in wanted for k in prompts if k.lower() == n), None)
        return EmbeddingRequest.model_validate(
            {
                "input": list(self.texts),
                **({"embedding_type": "sparse"} if "sparse" in self.embedding_types else {}),
                "model": self.model,
                "dimensions": self.output_dimension,
                "prompt_name": name,
                # no matching prompt: none at all (not the model's default prompt)
                "prompt": "" if name is None else None,
                "truncate": _TRUNCATE[self.truncate],
            }
        )


def quantized_type(kind: str) -> str:
    """The quantize() type behind a Cohere embedding type (base64 is float32 bytes)."""
    return "float" if kind == "base64" else kind


def embeddings_by_type(
    vectors: np.ndarray | None,
    kinds: list[str],
    calibration: Calibration,
    sparse: np.ndarray | None = None,
    multivector: list[np.ndarray] | None = None,
) -> dict[str, list[Any]]:
    """Each type's vectors from the float `vectors`; `sparse`: vocabulary-sized rows beside them
    (BGE-M3's lexical weights from the same pass), else `vectors` themselves are (SPLADE);
    `multivector`: each text's token vectors (a ColBERT model's, or BGE-M3's from the same pass)."""
    out: dict[str, list[Any]] = {}
    for kind in dict.fromkeys(kinds):  # each type once, in the order asked
        if kind == "multivector":
            assert multivector is not None, "the route computes multi-vectors when asked for them"
            out[kind] = [m.tolist() for m in multivector]
            continue
        assert vectors is not None, "a multi-vector-only answer has no other type"
        if kind == "sparse":  # the vocabulary-sized rows' non-zero entries
            out[kind] = [sparse_item(v) for v in (vectors if sparse is None else sparse)]
            continue
        q = quantize(vectors, quantized_type(kind), calibration)
        out[kind] = [to_base64(v) for v in q] if kind == "base64" else q.tolist()
    return out


def cohere_body(
    req: CohereEmbedRequest, embeddings: dict[str, list[Any]], n_tokens: int, metadata: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": embeddings,
        "texts": list(req.texts),
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": n_tokens}},
        **metadata,
    }
