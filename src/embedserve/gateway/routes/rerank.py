"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`) through the gateway: placed whole
(gateway/routes/pipeline.py), each request to one pool.

Policy: the request's longest (query, document) pair, counted as the reranker reads it
(gateway/pools/counting.py), chooses the pool as one `/v1/embeddings` input would: the smallest pool
of the route that fits it, then the route's other pools that fit as fallbacks, the same over-
long policy (truncate), the same retries on 429 / 503 / connection errors, the same end-to-end
deadline. The pool's answer comes back as it is (ranked results), with the gateway's timing and
pool headers (in TEI's shape when the client sent TEI's body). A rerank is not split across
pools: one query is scored against all its documents, and `top_n` ranks them together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedserve.api.rerank import RerankRequest
from embedserve.api.routes import RERANK
from embedserve.api.tei import tei_rerank_body
from embedserve.gateway.pools.forward import PartResult
from embedserve.gateway.routes.jobs import WholeJob
from embedserve.gateway.routes.pipeline import GatewayRoute, Pipeline


class PairsJob(WholeJob[RerankRequest]):
    """A query and its documents, counted per (query, document) pair."""

    def __init__(self, gw: Pipeline, req: RerankRequest) -> None:
        super().__init__(req, req.model, len(req.texts), req.truncate)
        self.counter = gw.counter

    @property
    def truncate_remedy(self) -> str:
        return self.req.truncate_remedy  # TEI's body or ours

    def count(self) -> list[int]:
        req = self.req
        return self.counter.count_pairs(req.query, req.texts, req.instruction)

    def body(self, results: Sequence[PartResult], counts: Sequence[int], name: str | None) -> Any:
        body = super().body(results, counts, name)  # the pool ranks in Cohere's shape
        return tei_rerank_body(self.req, body) if self.req.tei else body


RERANK_ROUTE = GatewayRoute(RERANK, PairsJob)
