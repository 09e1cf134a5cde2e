"""`POST /v2/embed` (Cohere's embed API) on the serving template: the work of `/v1/embeddings`
(prompt from `input_type`, truncation: `CohereEmbedRequest.to_embedding_request`), the vectors
in every requested type with a schema per type; the shapes are in api/cohere.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from embedserve.api.cohere import CohereEmbedRequest, cohere_body, embeddings_by_type, quantized_type
from embedserve.api.routes import COHERE_EMBED
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.server.embeddings_routes import EmbeddingsJob
from embedserve.server.pipeline import Computed, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized


class CohereEmbedJob(EmbeddingsJob):
    def __init__(self, svc: EmbeddingService, req: CohereEmbedRequest) -> None:
        super().__init__(svc, req.to_embedding_request(svc.engine.config.prompts))
        self.cohere = req

    def tokenize(self) -> list[Tokenized]:
        req = self.cohere
        kinds = [quantized_type(k) for k in req.embedding_types]
        self.svc.check_types(kinds, req.output_dimension, one_pass=True)
        self.both = "sparse" in kinds and len(set(kinds)) > 1  # BGE-M3: dense and sparse, one pass
        self.lexical: np.ndarray | None = None
        if self.both:  # the sparse side's checks; the dense side's dimensions apply
            return self.svc.engine.tokenize(list(req.texts), self.prompt(), self.req.truncate)
        return super().tokenize()

    def prompt(self) -> str:
        return self.svc.engine.resolve_prompt(self.req.prompt_name, self.req.prompt)

    async def run(self, tokenized: list[Tokenized]) -> list[EmbeddingOutput]:
        if not self.both:
            return await super().run(tokenized)
        req = self.cohere
        dense, self.lexical, outputs = await self.svc.engine.embed_dense_and_lexical_async(
            tokenized, dimensions=req.output_dimension, priority=self.req.priority
        )
        return [dataclasses.replace(o, embedding=d) for o, d in zip(outputs, dense, strict=True)]

    def body(self, done: Computed) -> dict[str, Any]:
        req, svc = self.cohere, self.svc
        meta = svc.metadata
        schemas = {
            k: meta.schema(req.output_dimension, None, svc.schema_type(quantized_type(k)))
            for k in req.embedding_types
        }
        kind = "sparse" if svc.engine.sparse_head is not None else "float"  # a SPLADE model's: sparse
        metadata = {**meta.fields(req.output_dimension, embedding_type=kind), "embedding_schemas": schemas}
        vectors = embeddings_by_type(done.matrix(), list(req.embedding_types), svc.calibration, self.lexical)
        return cohere_body(req, vectors, done.n_tokens, metadata)


COHERE_EMBED_ROUTE = ServerRoute(COHERE_EMBED, CohereEmbedJob)
