"""`POST /v1/rerank` (also `/rerank`, `/v2/rerank`) through the gateway: placed whole
(gateway/pipeline.py), each request to one pool.

Policy: the request's longest (query, document) pair, counted as the reranker reads it
(gateway/counting.py), chooses the pool as one `/v1/embeddings` input would: the smallest pool
of the route that fits it, then the route's other pools that fit as fallbacks, the same
over-long policy (truncate), the same retries on 429 / 503 / connection errors, the same
end-to-end deadline. The pool's answer comes back as it is (ranked results), with the gateway's
timing and pool headers. A rerank is not split across pools: one query is scored against all
its documents, and `top_n` ranks them together.
"""

from __future__ import annotations

from embedserve.api.rerank import RerankRequest
from embedserve.api.routes import RERANK
from embedserve.gateway.jobs import WholeJob
from embedserve.gateway.pipeline import GatewayRoute, Pipeline


class PairsJob(WholeJob[RerankRequest]):
    """A query and its documents, counted per (query, document) pair."""

    def __init__(self, gw: Pipeline, req: RerankRequest) -> None:
        super().__init__(req, req.model, len(req.texts), req.truncate)
        self.counter = gw.counter

    def count(self) -> list[int]:
        req = self.req
        return self.counter.count_pairs(req.query, req.texts, req.instruction)


RERANK_ROUTE = GatewayRoute(RERANK, PairsJob)
