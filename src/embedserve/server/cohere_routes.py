"""`POST /v2/embed` (Cohere's embed API) on the serving template: the work of `/v1/embeddings`
(prompt from `input_type`, truncation: `CohereEmbedRequest.to_embedding_request`), the vectors
in every requested type with a schema per type; the shapes are in api/cohere.py."""

from __future__ import annotations

from typing import Any

from embedserve.api.cohere import CohereEmbedRequest, cohere_body, embeddings_by_type, quantized_type
from embedserve.api.routes import COHERE_EMBED
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
        self.svc.check_types([quantized_type(k) for k in req.embedding_types], req.output_dimension)
        return super().tokenize()

    def body(self, done: Computed) -> dict[str, Any]:
        req, svc = self.cohere, self.svc
        meta = svc.metadata
        schemas = {
            k: meta.schema(req.output_dimension, None, svc.schema_type(quantized_type(k)))
            for k in req.embedding_types
        }
        kind = "sparse" if svc.engine.sparse_head is not None else "float"  # a SPLADE model's: sparse
        metadata = {**meta.fields(req.output_dimension, embedding_type=kind), "embedding_schemas": schemas}
        vectors = embeddings_by_type(done.matrix(), list(req.embedding_types), svc.calibration)
        return cohere_body(req, vectors, done.n_tokens, metadata)


COHERE_EMBED_ROUTE = ServerRoute(COHERE_EMBED, CohereEmbedJob)
