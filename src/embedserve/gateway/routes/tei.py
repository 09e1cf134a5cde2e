"""TEI's `POST /embed` and `/embed_sparse` (the same with a SPLADE model's sparse vectors) through
the gateway: the work of `/v1/embeddings` (split per input, parts sent to the pools'
`/v1/embeddings`, so the embedding-schema check and the count check apply), answered as TEI does:
the vectors in input order. `/similarity` goes whole to the pool of its longest sentence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedserve.api.routes import EMBEDDINGS, SIMILARITY, TEI_EMBED, TEI_EMBED_SPARSE
from embedserve.api.tei import TeiEmbedRequest, TeiEmbedSparseRequest, embed_vectors, policy, sparse_vectors
from embedserve.api.tei_similarity import SimilarityRequest
from embedserve.errors import TEI_REMEDY
from embedserve.gateway.pools.forward import PartResult
from embedserve.gateway.routes.embeddings import EmbeddingsJob
from embedserve.gateway.routes.jobs import TextsJob
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline


class TeiJob(EmbeddingsJob):
    """TEI's bodies: an over-long input's hint names TEI's `truncate` flag."""

    @property
    def truncate_remedy(self) -> str:
        return TEI_REMEDY


class TeiEmbedJob(TeiJob):
    def __init__(self, gw: Pipeline, req: TeiEmbedRequest) -> None:
        super().__init__(gw, req.to_embedding_request())

    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> Any:
        return embed_vectors(super().body(results, counts, name))


class TeiEmbedSparseJob(TeiJob):
    def __init__(self, gw: Pipeline, req: TeiEmbedSparseRequest) -> None:
        super().__init__(gw, req.to_embedding_request())

    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> Any:
        return sparse_vectors(super().body(results, counts, name))


class SimilarityJob(TextsJob[SimilarityRequest]):
    def __init__(self, gw: Pipeline, req: SimilarityRequest) -> None:
        direction = policy(req.truncate, req.truncation_direction)
        super().__init__(req, gw.counter, req.texts, req.prompt_name, direction, TEI_REMEDY)


TEI_EMBED_ROUTE = GatewayRoute(TEI_EMBED, TeiEmbedJob, upstream=EMBEDDINGS)
SIMILARITY_ROUTE = GatewayRoute(SIMILARITY, SimilarityJob)
TEI_EMBED_SPARSE_ROUTE = GatewayRoute(TEI_EMBED_SPARSE, TeiEmbedSparseJob, upstream=EMBEDDINGS)
