"""TEI's `POST /embed` and `POST /embed_sparse` on the serving template: the work of
`/v1/embeddings` (api/tei.py turns the body into an embeddings request, sparse for the second),
answered as TEI does: the vectors, in input order."""

from __future__ import annotations

from typing import Any

from embedserve.api.routes import TEI_EMBED, TEI_EMBED_SPARSE
from embedserve.api.tei import TeiEmbedRequest, TeiEmbedSparseRequest, embed_vectors, sparse_vectors
from embedserve.errors import TEI_REMEDY
from embedserve.server.embeddings_routes import EmbeddingsJob
from embedserve.server.pipeline import Computed, ServerRoute
from embedserve.server.serving import EmbeddingService


class TeiJob(EmbeddingsJob):
    """TEI's bodies: an over-long input's hint names TEI's `truncate` flag."""

    @property
    def truncate_remedy(self) -> str:
        return TEI_REMEDY


class TeiEmbedJob(TeiJob):
    def __init__(self, svc: EmbeddingService, req: TeiEmbedRequest) -> None:
        super().__init__(svc, req.to_embedding_request())

    def body(self, done: Computed) -> list[Any]:
        return embed_vectors(super().body(done))


class TeiEmbedSparseJob(TeiJob):
    def __init__(self, svc: EmbeddingService, req: TeiEmbedSparseRequest) -> None:
        super().__init__(svc, req.to_embedding_request())

    def body(self, done: Computed) -> list[Any]:
        return sparse_vectors(super().body(done))


TEI_EMBED_ROUTE = ServerRoute(TEI_EMBED, TeiEmbedJob)
TEI_EMBED_SPARSE_ROUTE = ServerRoute(TEI_EMBED_SPARSE, TeiEmbedSparseJob)
