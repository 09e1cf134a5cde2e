"""`POST /v2/embed` (Cohere) and `POST /v1/rerank` through the gateway: each request goes whole
to one pool.

Policy: the request's longest input (a text with the prompt its input_type picks; for rerank a
(query, document) pair as the reranker reads it, gateway/counting.py) chooses the pool as one
`/v1/embeddings` input would: the smallest pool of the route that fits it, then the route's
other pools that fit as fallbacks, the same over-long policy (truncate), the same retries on
429 / 503 / connection errors, the same end-to-end deadline. The pool's answer comes back as it
is (ranked results, vectors by type), with the gateway's timing and pool headers. A request is
not split across pools: a rerank's top_n and a Cohere body's typed vector lists would have to
be merged, and one pool per request keeps the answer exactly the server's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from embedserve.api.cohere import CohereEmbedRequest
from embedserve.api.http import COHERE_EMBED_PATH, RERANK_PATH
from embedserve.api.protocol import ApiError
from embedserve.api.rerank import RerankRequest
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.gateway.forward import Part
from embedserve.gateway.routing import NoPoolAvailable, place_inputs
from embedserve.gateway.service import GatewayService, response_headers

Answer = tuple[dict[str, Any], dict[str, str]]


async def cohere_embed(
    service: GatewayService, req: CohereEmbedRequest, traffic_class: str, timeout_s: float | None = None
) -> Answer:
    inner = req.to_embedding_request(service.counter.prompts)

    def count() -> list[int]:
        prompt = service.counter.resolve_prompt(inner.prompt_name, inner.prompt)
        return service.counter.count(inner.items, prompt)

    payload = req.model_dump(exclude_unset=True, exclude={"model"})
    return await _forward_whole(
        service, COHERE_EMBED_PATH, req.model, payload, count, inner.truncate, traffic_class, timeout_s
    )


async def rerank(
    service: GatewayService, req: RerankRequest, traffic_class: str, timeout_s: float | None = None
) -> Answer:
    def count() -> list[int]:
        return service.counter.count_pairs(req.query, req.texts, req.instruction)

    payload = req.model_dump(exclude_unset=True, exclude={"model", "priority"})
    payload["priority"] = traffic_class
    return await _forward_whole(
        service, RERANK_PATH, req.model, payload, count, req.truncate, traffic_class, timeout_s
    )


async def _forward_whole(
    service: GatewayService,
    path: str,
    model: str | None,
    payload: dict[str, Any],
    count: Callable[[], list[int]],
    truncate: str,
    traffic_class: str,
    timeout_s: float | None,
) -> Answer:
    start = time.perf_counter()
    deadline = service.deadline(timeout_s)
    route = service.route_for(traffic_class, model)
    metrics = service.metrics
    try:
        counts: list[int] = await asyncio.to_thread(count)  # tokenizing: off the event loop
        limit = service.config.max_inputs_per_request
        if len(counts) > limit:
            raise InvalidInputError(f"{len(counts)} inputs in one request; the limit is {limit}")
        placements = place_inputs(
            counts, route, service.config.limits(), service.upstreams.available(), truncate
        )
    except InputTooLongError as e:
        metrics.rejections.labels(traffic_class, "too_long").inc()
        raise ApiError(400, str(e)) from None
    except InvalidInputError as e:
        raise ApiError(400, str(e)) from None
    except NoPoolAvailable as e:
        metrics.rejections.labels(traffic_class, "unavailable").inc()
        retry = str(max(1, round(service.config.health_interval_s)))
        raise ApiError(503, str(e), "service_unavailable", {"Retry-After": retry}) from None
    # The longest input's pools fit every input of the request.
    longest = placements[max(range(len(counts)), key=counts.__getitem__)]
    if longest.fallback:
        metrics.fallbacks.labels(longest.preferred, traffic_class, "unavailable").inc()
    part = Part(longest.candidates, list(range(len(counts))), sum(counts), payload, path, deadline)
    (result,) = await service.run_parts([part], traffic_class, deadline)
    total = time.perf_counter() - start
    metrics.latency.labels(traffic_class).observe(total)
    metrics.overhead.labels(traffic_class).observe(max(total - result.elapsed, 0.0))
    return result.body, response_headers([result], result.elapsed, total)
