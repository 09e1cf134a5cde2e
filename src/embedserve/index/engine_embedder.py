"""The engine in this process as an embedder: the shared engine adapter (embedders/engine.py)
with index's traffic classes.

Its metadata is the server's (`EngineSource.metadata`, schema.py), so a vector indexed in-process
and a query embedded by `embedserve serve` over the same model files share a schema, and any
difference in the vector space does not.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from embedserve.embedders.engine import EngineSource, open_engine
from embedserve.engine.ask import Ask, LateChunking, answers_as
from embedserve.engine.engine import EmbeddingOutput, Engine
from embedserve.engine.loop import wait_all
from embedserve.engine.options import EngineOptions
from embedserve.errors import ModelLoadError
from embedserve.index.embedder import DOCUMENT_PROMPT, QUERY_PROMPT, Traffic, VectorMeta, pick_prompt
from embedserve.pooling.chunks import SpanPooling
from embedserve.pooling.outputs import Output
from embedserve.tokenizer import Tokenizer


class EngineEmbedder:
    """The engine in this process; documents go in as batch-class traffic."""

    def __init__(
        self,
        engine: Engine | EngineSource,
        name: str,
        model_version: str | None = None,
        dimensions: int | None = None,
        query_prompt_name: str | None = None,
        late: bool = False,
    ) -> None:
        self.source = engine if isinstance(engine, EngineSource) else EngineSource(engine)
        self.late = late
        self.engine = self.source.engine
        config = self.engine.config
        self.engine.renderer.check_dimensions(dimensions)
        if config.task != "embed":
            raise ModelLoadError(f"{config.model_path} is a reranker: it cannot embed documents")
        meta = self.metadata = self.source.metadata(name, model_version)
        self.meta = VectorMeta(**meta.fields(dimensions, late=SpanPooling.MEAN.value if late else None))
        self.dimension = dimensions or config.pooling.output_size(config.model.hidden_size)
        self.dimensions = dimensions
        self.tokenizer: Tokenizer | None = self.engine.tokenizer
        self.max_tokens: int | None = self.source.max_length
        self._docs = Traffic.documents(pick_prompt(config.prompts, DOCUMENT_PROMPT, None))
        self._queries = Traffic.queries(pick_prompt(config.prompts, QUERY_PROMPT, query_prompt_name))
        # The engine validates a prompt name only when it embeds: fail now, not mid-run.
        self.engine.renderer.prompt(self._queries.prompt_name, None)
        doc_prompt = self.engine.renderer.prompt(self._docs.prompt_name, None)
        self.late_prompt_tokens = len(
            self.engine.tokenizer.backend.encode(doc_prompt, add_special_tokens=False)
        )

    @classmethod
    def load(
        cls,
        model: str | Path,
        options: EngineOptions,
        name: str | None = None,
        model_version: str | None = None,
        dimensions: int | None = None,
        query_prompt_name: str | None = None,
        late: bool = False,
    ) -> EngineEmbedder:
        source = EngineSource(open_engine(model, options), options)
        try:
            return cls(source, name or Path(model).name, model_version, dimensions, query_prompt_name, late)
        except BaseException:
            source.close()
            raise

    def _embed(self, texts: list[str], traffic: Traffic) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return self.source.embed_texts(
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

    def embed_lexical(self, texts: list[str], queries: bool) -> np.ndarray:
        """BGE-M3's lexical weights ([n, vocab]) as documents or queries (their prompt and class)."""
        traffic = self._queries if queries else self._docs
        if not texts:
            return np.zeros((0, self.engine.config.model.vocab_size), dtype=np.float32)
        ask = Ask(Output.LEXICAL, traffic.prompt_name, priority=traffic.priority, truncate=traffic.truncate)
        return np.stack([o.embedding for o in answers_as(self.engine.run(texts, ask), EmbeddingOutput)])

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        """Each window late-chunked (engine/late.py), all submitted at once as batch traffic."""
        ask = Ask(
            Output.SPANS, self._docs.prompt_name, dimensions=self.dimensions, priority=self._docs.priority
        )
        docs = [self.engine.prepare(text, replace(ask, late=LateChunking(spans))) for text, spans in windows]
        futures = [f for doc in docs for f in self.engine.submit(doc)]  # one request each: all queued
        return [_rows(fin.vector) for fin in wait_all(futures)]

    def close(self) -> None:
        self.source.close()


def _rows(vector: torch.Tensor | None) -> np.ndarray:
    assert vector is not None  # wait_all raised for a failed request
    return vector.numpy().astype(np.float32, copy=False)
