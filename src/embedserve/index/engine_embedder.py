"""The engine in this process as an embedder.

It computes the vector metadata with the server's own function (`embedserve.schema`), so a
vector indexed in-process and a query embedded by `embedserve serve` over the same model files
share a schema, and any difference in the vector space does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from embedserve.engine.options import EngineOptions
from embedserve.errors import ModelLoadError
from embedserve.index.embedder import DOCUMENT_PROMPT, QUERY_PROMPT, Traffic, VectorMeta, pick_prompt
from embedserve.schema import ModelMetadata, fingerprint_model_dir
from embedserve.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch loads only when a model runs here, not for endpoints or the store
    from embedserve.engine.engine import Engine


class EngineEmbedder:
    """The engine in this process; documents go in as batch-class traffic."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        model_version: str | None = None,
        dimensions: int | None = None,
        query_prompt_name: str | None = None,
    ) -> None:
        engine.check_dimensions(dimensions)
        if engine.config.task != "embed":
            raise ModelLoadError(f"{engine.config.model_path} is a reranker: it cannot embed documents")
        self.engine = engine
        metadata = ModelMetadata.from_engine_config(
            engine.config, name, model_version, fingerprint_model_dir(engine.config.model_path)
        )
        self.meta = VectorMeta(**metadata.fields(dimensions))
        self.dimension = dimensions or engine.config.model.hidden_size
        self.dimensions = dimensions
        self.tokenizer: Tokenizer | None = engine.tokenizer
        self.max_tokens: int | None = engine.config.scheduler.max_model_len
        prompts = engine.config.prompts
        self._docs = Traffic.documents(pick_prompt(prompts, DOCUMENT_PROMPT, None))
        self._queries = Traffic.queries(pick_prompt(prompts, QUERY_PROMPT, query_prompt_name))
        # The engine validates a prompt name only when it embeds: fail now, not mid-run.
        engine.resolve_prompt(self._queries.prompt_name, None)

    @classmethod
    def load(
        cls,
        model: str | Path,
        options: EngineOptions,
        name: str | None = None,
        model_version: str | None = None,
        dimensions: int | None = None,
        query_prompt_name: str | None = None,
    ) -> EngineEmbedder:
        from embedserve.engine.engine import Engine

        engine = Engine.from_pretrained(model, options)
        try:
            return cls(engine, name or Path(model).name, model_version, dimensions, query_prompt_name)
        except BaseException:
            engine.close()
            raise

    def _embed(self, texts: list[str], traffic: Traffic) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self.engine.embed(
            texts,
            prompt_name=traffic.prompt_name,
            dimensions=self.dimensions,
            priority=traffic.priority,
            truncate=traffic.truncate,
        )

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._docs)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._queries)

    def close(self) -> None:
        self.engine.close()
