"""TEI's `POST /similarity` and `POST /decode` bodies, and the hub-style bodies of TEI's `POST /`.

    POST /similarity {"inputs": {"source_sentence": str, "sentences": [str]}, "truncate",
                     "truncation_direction", "prompt_name"} -> [float]: the cosine of each
                     sentence to the source sentence, in order (the work of /v1/embeddings on
                     [source, *sentences], normalized)
    POST /decode     {"ids": [int] | [[int]], "skip_special_tokens": true} -> [str], one text per
                     id list

huggingface_hub's InferenceClient, given a server's base URL, POSTs every task to `/` as
`{"inputs": ..., "parameters": {...}}`: `hub_body` moves the parameters it set beside `inputs`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from embedserve.api.protocol import EmbeddingRequest, Text, TokenId
from embedserve.api.tei import Direction, embed_vectors, policy


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    source_sentence: Text
    sentences: list[Text] = Field(min_length=1)


class SimilarityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: SimilarityInputs
    model: str | None = None
    truncate: bool | None = False
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None

    @property
    def texts(self) -> list[str]:
        return [self.inputs.source_sentence, *self.inputs.sentences]

    def to_embedding_request(self) -> EmbeddingRequest:
        return EmbeddingRequest(
            input=self.texts,
            model=self.model,
            truncate=policy(self.truncate, self.truncation_direction),
            normalize=True,
            prompt_name=self.prompt_name,
        )


def similarities(body: dict[str, Any]) -> list[float]:
    """A `/v1/embeddings` answer for [source, *sentences] (unit vectors) as TEI's cosines."""
    vectors = np.asarray(embed_vectors(body), dtype=np.float64)
    return [float(v) for v in vectors[1:] @ vectors[0]]


class DecodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ids: (
        Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    model: str | None = None
    skip_special_tokens: bool = True

    @property
    def batch(self) -> list[list[int]]:
        """One id list per text to decode."""
        if isinstance(self.ids[0], int):
            return [cast(list[int], self.ids)]
        return cast(list[list[int]], self.ids)


def hub_body(body: bytes) -> tuple[Any, bytes]:
    """(the JSON body, the bytes to parse): huggingface_hub's `parameters` object moved beside
    `inputs` (its null values dropped; a key also given outside it is left for the route to
    refuse). A body that is not such an object passes unchanged."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, body  # the route's parser names the JSON error
    if not isinstance(raw, dict) or not isinstance(raw.get("parameters"), dict):
        return raw, body
    params = {k: v for k, v in raw.pop("parameters").items() if v is not None}
    clash = {k: v for k, v in params.items() if k in raw}
    flat = {**raw, **{k: v for k, v in params.items() if k not in raw}}
    if clash:
        flat["parameters"] = clash
    return flat, json.dumps(flat).encode()
