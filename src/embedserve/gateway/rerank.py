"""`POST /v1/rerank` through the gateway: each request goes whole to one pool.

Policy: the request's longest (query, document) pair, counted as the reranker reads it
(gateway/counting.py), chooses the pool as one `/v1/embeddings` input would: the smallest pool
of the route that fits it, then the route's other pools that fit as fallbacks, the same
over-long policy (truncate), the same retries on 429 / 503 / connection errors, the same
end-to-end deadline. The pool's answer comes back as it is (ranked results), with the gateway's
timing and pool headers. A rerank is not split across pools: one query is scored against all
its documents, and `top_n` ranks them together.
"""

from __future__ import annotations

import time
from typing import Any

from embedserve.api.rerank import RerankRequest
from embedserve.api.routes import RERANK_PATH
from embedserve.gateway.forward import Part
from embedserve.gateway.service import GatewayService

Answer = tuple[dict[str, Any], dict[str, str]]


async def rerank(
    service: GatewayService, req: RerankRequest, traffic_class: str, timeout_s: float | None = None
) -> Answer:
    start = time.perf_counter()
    deadline = service.deadline(timeout_s)
    route = service.route_for(traffic_class, req.model)
    metrics = service.metrics

    def count() -> list[int]:
        return service.counter.count_pairs(req.query, req.texts, req.instruction)

    counts, placements = await service.place(len(req.texts), count, route, req.truncate, traffic_class)
    payload = req.model_dump(exclude_unset=True, exclude={"model", "priority"})
    payload["priority"] = traffic_class
    # The longest input's pools fit every input of the request.
    longest = placements[max(range(len(counts)), key=counts.__getitem__)]
    if longest.fallback:
        metrics.fallbacks.labels(longest.preferred, traffic_class, "unavailable").inc()
    part = Part(longest.candidates, list(range(len(counts))), sum(counts), payload, RERANK_PATH, deadline)
    (result,) = await service.run_parts([part], traffic_class, deadline)
    return result.body, service.answered([result], start, traffic_class)
