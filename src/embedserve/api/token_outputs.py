"""Every token's vector: TEI's `POST /embed_all` and vLLM's `POST /pooling`.

    POST /embed_all  {"inputs": str | [str], "truncate", "truncation_direction", "prompt_name"}
                     -> [[[float]]]: per input, each token's final hidden state (special tokens
                     and the prompt included), unnormalized, as TEI answers
    POST /pooling    {"input": str | [str], "task": "embed" | "token_embed", "dimensions",
                     "normalize", "truncate", "prompt_name"} -> vLLM's body: `data` holds per
                     input {"index", "object": "pooling", "data"}: its vector (`embed`, as
                     /v1/embeddings), or each token's (`token_embed`, as /embed_all)

The token vectors come from late chunking's pooling with one span per position
(late_chunking.every_token): the same batching, chunked prefill and preemption as any request.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from embedserve.api.protocol import EmbeddingRequest, Texts, listed
from embedserve.api.tei import Direction, policy


class EmbedAllRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: Texts
    model: str | None = None
    truncate: bool | None = False
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None

    @property
    def items(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)

    @property
    def policy(self) -> Literal["error", "end", "start"]:
        return policy(self.truncate, self.truncation_direction)


class PoolingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input: Texts
    model: str | None = None
    task: Literal["embed", "token_embed"] = "embed"
    encoding_format: Literal["float"] = "float"
    dimensions: int | None = Field(default=None, ge=1, description="embed: Matryoshka width")
    normalize: bool | None = Field(default=None, description="embed: the model's default when absent")
    truncate: Literal["error", "end", "start"] = "error"
    prompt_name: str | None = None
    priority: Literal["online", "batch"] = "online"

    @property
    def items(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def to_embedding_request(self) -> EmbeddingRequest:
        return EmbeddingRequest(
            input=self.input,
            model=self.model,
            dimensions=self.dimensions,
            normalize=self.normalize,
            truncate=self.truncate,
            prompt_name=self.prompt_name,
            priority=self.priority,
        )


def token_vectors(rows: list[np.ndarray]) -> list[list[list[float]]]:
    """Each input's [tokens, hidden] rows as JSON lists."""
    return [np.asarray(r, dtype=np.float32).tolist() for r in rows]


def pooling_body(model: str, data: list[Any], n_tokens: int) -> dict[str, Any]:
    """vLLM's `/pooling` answer: one item per input, in input order."""
    items = [{"index": i, "object": "pooling", "data": d} for i, d in enumerate(data)]
    return listed("pool", items, n_tokens, {"model": model})
