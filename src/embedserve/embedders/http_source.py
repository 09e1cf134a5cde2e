"""`HttpSource`: the VectorSource of an OpenAI-compatible `/v1/embeddings` (the spec's keys and
the wire format: embedders/http.py). Text goes with its prompt prepended; text + image inputs as
content items, the prompt as the instruction."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.embedders.base import Item, Parts, VectorSource, split_items
from embedserve.embedders.http import EmbeddingsClient, Endpoint, content_item
from embedserve.embedders.spec import Spec


class HttpSource(VectorSource):
    kind = "http"

    def __init__(self, spec: Spec) -> None:
        self.spec = spec.shown
        self.endpoint = Endpoint(spec)
        self.base = self.endpoint.base
        tokenizer = spec.option("tokenizer")
        self.model_dir = Path(tokenizer) if tokenizer else None
        self.max_length = spec.int_option("max_length")
        self.take_batching(spec, 32, 16384)
        self.client = EmbeddingsClient(self.endpoint, retries=spec.int_option("retries", 8) or 0)
        self.server_metadata: dict[str, Any] = {}
        self.usage_tokens = 0
        self.model_name = self.endpoint.model or self.endpoint.only_model(
            self.client.send("GET", self.endpoint.models_url)
        )

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        if any(isinstance(i, Parts) for i in items):  # content items; the prompt is the instruction
            reply = self.client.embed([content_item(i) for i in items], self.model_name, prompt)
        else:
            texts, ids = split_items(items)
            payload: list[Any] = [prompt + t for t in texts] if texts else ids
            reply = self.client.embed(payload, self.model_name)
        if not self.server_metadata:
            self.server_metadata = reply.metadata
        self.usage_tokens += reply.prompt_tokens
        return reply.vectors

    def describe(self) -> dict[str, Any]:
        meta = self.server_metadata
        return {
            "kind": self.kind,
            "spec": self.spec,
            "model": meta.get("model", self.model_name),
            "model_version": meta.get("model_version"),
            "dtype": meta.get("dtype"),
            "backend_profile": meta.get("backend_profile", f"http:{self.base}"),
            "embedding_schema": meta.get("embedding_schema"),
            "config": {
                "endpoint": self.endpoint.url,
                "model_name": self.model_name,
                "extra_fields": self.endpoint.extra,
                "server_metadata": meta,
                "usage_prompt_tokens": self.usage_tokens,
                "batch_size": self.batch_items,
                "batch_tokens": self.batch_tokens,
            },
        }

    def close(self) -> None:
        self.client.close()
