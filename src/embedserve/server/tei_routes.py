"""TEI's `POST /embed`, `POST /embed_sparse` and `POST /similarity` on the serving template: the
work of `/v1/embeddings` (api/tei.py turns the body into an embeddings request, sparse for the
second; the source sentence and the sentences, normalized, for the third), answered as TEI does:
the vectors in input order, or each sentence's cosine to the source."""

from __future__ import annotations

from typing import Any

from embedserve.api.routes import SIMILARITY, TEI_EMBED, TEI_EMBED_SPARSE
from embedserve.api.tei import TeiEmbedRequest, TeiEmbedSparseRequest, embed_vectors, sparse_vectors
from embedserve.api.tei_similarity import SimilarityRequest, similarities
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


class SimilarityJob(TeiJob):
    def __init__(self, svc: EmbeddingService, req: SimilarityRequest) -> None:
        super().__init__(svc, req.to_embedding_request())

    def body(self, done: Computed) -> list[float]:
        return similarities(super().body(done))


TEI_EMBED_ROUTE = ServerRoute(TEI_EMBED, TeiEmbedJob)
SIMILARITY_ROUTE = ServerRoute(SIMILARITY, SimilarityJob)
TEI_EMBED_SPARSE_ROUTE = ServerRoute(TEI_EMBED_SPARSE, TeiEmbedSparseJob)
