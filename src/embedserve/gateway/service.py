"""One client request through the gateway: count, place, split, forward, reassemble.

    inputs [q0, d1, q2]  --count-->  [20, 9000, 31]  --place-->  short: [0, 2]   long: [1]
    parts run concurrently; vectors go back to their input positions; usage is summed.

All or nothing: if any part fails, the others are cancelled (their upstream requests are
closed, which aborts the queued work there) and the client gets the error, never a partial list.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from embedserve.api.deadline import DEADLINE_EXCEEDED, effective_timeout
from embedserve.api.multimodal import to_json
from embedserve.api.protocol import ApiError, EmbeddingRequest
from embedserve.api.routes import EMBEDDINGS_PATH, model_not_found, too_many_inputs
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.gateway.config import GatewayConfig, RouteConfig
from embedserve.gateway.counting import TokenCounter
from embedserve.gateway.forward import Part, PartResult
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.routing import NoPoolAvailable, Placement, group_placements, place_inputs

log = logging.getLogger(__name__)

POOLS_HEADER = "x-embedserve-pools"
_METADATA = ("model_version", "dtype", "backend_profile")


class PoolDirectory(Protocol):
    """What the service and the app ask about the pools: HTTP upstreams (upstreams.UpstreamSet)
    or Ray Serve deployments (embedserve.scale.ingress)."""

    schema: str | None  # the gateway's embedding_schema, fixed once known

    def available(self) -> set[str]: ...

    def model_card(self) -> dict[str, Any] | None: ...

    def describe(self) -> dict[str, Any]: ...


class PartRunner(Protocol):
    """Runs one part on its candidate pools, falling back in order (forward.Forwarder over HTTP)."""

    async def run(self, part: Part, traffic_class: str) -> PartResult: ...


class GatewayService:
    def __init__(
        self,
        config: GatewayConfig,
        counter: TokenCounter,
        upstreams: PoolDirectory,
        metrics: GatewayMetrics,
        forwarder: PartRunner,
    ) -> None:
        self.config = config
        self.counter = counter
        self.upstreams = upstreams
        self.metrics = metrics
        self.forwarder = forwarder
        self._limits = config.limits()

    @property
    def model_name(self) -> str | None:
        card = self.upstreams.model_card()
        return self.config.served_model_name or (str(card["id"]) if card and "id" in card else None)

    def route_for(self, traffic_class: str, model: str | None) -> RouteConfig:
        """The class's route, after checking the request names this gateway's model (or none)."""
        route = self.config.route(traffic_class)
        if route is None:
            raise ApiError(400, f"this gateway has no route for traffic class {traffic_class!r}")
        name = self.model_name
        if model is not None and name is not None and model != name:
            raise model_not_found(model, name, "gateway")
        return route

    def deadline(self, caller_timeout_s: float | None) -> float:
        """When (time.monotonic()) a request must be answered: the gateway's request_timeout_s,
        or the client's X-Request-Timeout if shorter (api/deadline.py)."""
        return time.monotonic() + effective_timeout(self.config.deadline_s, caller_timeout_s)

    async def embed(
        self, req: EmbeddingRequest, traffic_class: str, timeout_s: float | None = None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        start = time.perf_counter()
        deadline = self.deadline(timeout_s)
        route = self.route_for(traffic_class, req.model)
        name = self.model_name
        items = req.items

        def count() -> list[int]:
            prompt = self.counter.resolve_prompt(req.prompt_name, req.prompt)
            return self.counter.count(items, prompt)

        counts, placements = await self.place(len(items), count, route, req.truncate, traffic_class)
        results = await self.run_split(
            counts,
            placements,
            lambda idx: _payload(req, items, idx, traffic_class),
            EMBEDDINGS_PATH,
            traffic_class,
            deadline,
        )
        return self._assemble(results, counts, name), self.answered(results, start, traffic_class)

    async def place(
        self,
        n_inputs: int,
        count: Callable[[], list[int]],
        route: RouteConfig,
        truncate: str,
        traffic_class: str,
    ) -> tuple[list[int], list[Placement]]:
        """Each input's token count (`count()`) and placement; refusals as 400 (too many or too
        long inputs, a bad prompt) or 503 + Retry-After (no pool ready), counted."""
        limit = self.config.max_inputs_per_request
        if n_inputs > limit:
            raise too_many_inputs(n_inputs, limit)
        try:
            # Tokenizing a long document takes milliseconds: keep it off the event loop.
            counts = await asyncio.to_thread(count)
            placements = place_inputs(counts, route, self._limits, self.upstreams.available(), truncate)
        except InputTooLongError as e:
            self.metrics.rejections.labels(traffic_class, "too_long").inc()
            raise ApiError(400, str(e)) from None
        except InvalidInputError as e:
            raise ApiError(400, str(e)) from None
        except NoPoolAvailable as e:
            self.metrics.rejections.labels(traffic_class, "unavailable").inc()
            retry = str(max(1, round(self.config.health_interval_s)))
            raise ApiError(503, str(e), "service_unavailable", {"Retry-After": retry}) from None
        return counts, placements

    async def run_split(
        self,
        counts: Sequence[int],
        placements: Sequence[Placement],
        payload_of: Callable[[list[int]], dict[str, Any]],
        path: str,
        traffic_class: str,
        deadline: float,
    ) -> list[PartResult]:
        """The inputs as one part per group of inputs with the same pools (`payload_of`: the
        part's body from its input positions), fallbacks counted, run all or nothing."""
        for p in placements:
            if p.fallback:
                self.metrics.fallbacks.labels(p.preferred, traffic_class, "unavailable").inc()
        parts = [
            Part(cands, idx, sum(counts[i] for i in idx), payload_of(idx), path, deadline)
            for cands, idx in group_placements(placements)
        ]
        return await self.run_parts(parts, traffic_class, deadline)

    def answered(self, results: Sequence[PartResult], start: float, traffic_class: str) -> dict[str, str]:
        """A request's latency and gateway overhead observed (`start`: its time.perf_counter()
        on arrival); its response headers."""
        total = time.perf_counter() - start
        upstream = max(r.elapsed for r in results)
        self.metrics.latency.labels(traffic_class).observe(total)
        self.metrics.overhead.labels(traffic_class).observe(max(total - upstream, 0.0))
        return response_headers(results, upstream, total)

    async def run_parts(self, parts: Sequence[Part], traffic_class: str, deadline: float) -> list[PartResult]:
        """All parts or none, within the request's end-to-end deadline (else 504)."""
        try:
            work = _all_or_nothing([self.forwarder.run(p, traffic_class) for p in parts])
            return await asyncio.wait_for(work, max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            self.metrics.rejections.labels(traffic_class, "deadline").inc()
            raise ApiError(
                504,
                f"request not answered within the gateway's deadline of {self.config.deadline_s:g} s "
                "(request_timeout_s, or the client's X-Request-Timeout if shorter); its upstream work "
                "was cancelled",
                DEADLINE_EXCEEDED,
            ) from None
        except ApiError as e:
            if e.status in (429, 503):
                self.metrics.rejections.labels(traffic_class, "no_capacity").inc()
            elif e.kind == DEADLINE_EXCEEDED:
                self.metrics.rejections.labels(traffic_class, "deadline").inc()
            raise

    def _assemble(
        self, results: Sequence[PartResult], counts: Sequence[int], name: str | None
    ) -> dict[str, Any]:
        schemas = {r.body.get("embedding_schema") for r in results}
        if len(schemas) != 1:
            # The guard keeps mixed schemas out of rotation; this is the last line of defence.
            found = {r.pool: r.body.get("embedding_schema") for r in results}
            raise ApiError(
                502,
                f"pools answered with different embedding schemas {found}; refusing to mix them",
                "server_error",
            )
        data: list[dict[str, Any]] = [{} for _ in counts]
        prompt_tokens = total_tokens = 0
        for r in results:
            for item in r.body["data"]:
                i = r.part.indices[item["index"]]
                data[i] = {**item, "index": i, "pool": r.pool}
                if not item.get("truncated") and item.get("num_tokens", counts[i]) != counts[i]:
                    self.metrics.count_mismatches.labels(r.pool).inc()
                    log.warning(
                        "input %d: the gateway counted %d tokens, pool %r counted %s: is the gateway's "
                        "--model the pools' model?", i, counts[i], r.pool, item.get("num_tokens"),
                    )  # fmt: skip
            usage = r.body.get("usage") or {}
            prompt_tokens += int(usage.get("prompt_tokens", 0))
            total_tokens += int(usage.get("total_tokens", 0))
        meta = {key: ",".join(sorted({str(r.body.get(key)) for r in results})) for key in _METADATA}
        return {
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": total_tokens},
            "model": name or str(results[0].body.get("model")),
            **meta,
            "embedding_schema": schemas.pop(),
        }


def _payload(
    req: EmbeddingRequest, items: Sequence[Any], indices: Sequence[int], traffic_class: str
) -> dict[str, Any]:
    # The client's options as sent (defaults left to the upstream); `model` is dropped because
    # each upstream may serve the model under its own name (the schema guard vouches for it).
    body = req.model_dump(exclude_unset=True, exclude={"model", "input", "priority"})
    body["input"] = [to_json(items[i]) for i in indices]
    body["priority"] = traffic_class
    return body


async def _all_or_nothing(work: Sequence[Awaitable[PartResult]]) -> list[PartResult]:
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def response_headers(results: Sequence[PartResult], upstream: float, total: float) -> dict[str, str]:
    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.2f}"

    def slowest(header: str) -> str | None:
        values = [float(v) for r in results if (v := r.headers.get(header)) is not None]
        return f"{max(values):.2f}" if values else None

    pools: dict[str, None] = {}
    for r in sorted(results, key=lambda r: r.part.indices[0]):
        pools[r.pool] = None
    out = {POOLS_HEADER: ",".join(pools), "x-upstream-time": ms(upstream), "x-total-time": ms(total)}
    for header in ("x-queue-time", "x-inference-time"):
        value = slowest(header)
        if value is not None:
            out[header] = value
    return out
