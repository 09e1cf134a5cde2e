"""The template every POST route runs on through the gateway: a route supplies its request's own
parts (a `Job`: count its inputs, a part's body, one body from the parts' answers); the stages
below run once for all.

    deadline -> model -> input limit -> count (off the loop) -> place -> parts -> run all or
    nothing within the deadline -> body -> latency metrics + headers

How a request becomes parts is its route's `placement` (api/routes.py):

    split   inputs [q0, d1, q2] --count--> [20, 9000, 31] --place--> short: [0, 2]  long: [1]
            one part per group of inputs with the same pools; the job reassembles the answers
    whole   one part of every input, on the pools of the longest input (they fit every input);
            the pool's answer comes back as it is (a rerank ranks all its documents together)

All or nothing: if any part fails, the others are cancelled (their upstream requests are
closed, which aborts the queued work there) and the client gets the error, never a partial body.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol

from embedserve.api.deadline import DEADLINE_EXCEEDED, effective_timeout
from embedserve.api.protocol import ApiError
from embedserve.api.refusals import model_not_found, too_many_inputs
from embedserve.api.routes import Req, Route
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.gateway.pools.config import GatewayConfig, RouteConfig
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import Part, PartResult
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.routing import NoPoolAvailable, Placement, group_placements, place_inputs
from embedserve.gateway.routes.jobs import Job, WholeJob

if TYPE_CHECKING:
    from embedserve.tracing.otel import RequestSpan, Tracing

POOLS_HEADER = "x-embedserve-pools"
Answer = tuple[Any, dict[str, str]]  # (response body: an object, or a list in TEI's shapes; headers)


class PoolDirectory(Protocol):
    """What the pipeline and the app ask about the pools: HTTP upstreams (upstreams.UpstreamSet)
    or Ray Serve deployments (embedserve.scale.ingress)."""

    schema: str | None  # the gateway's embedding_schema, fixed once known

    def available(self) -> set[str]: ...

    def model_card(self) -> dict[str, Any] | None: ...

    def describe(self) -> dict[str, Any]: ...


class PartRunner(Protocol):
    """Runs one part on its candidate pools, falling back in order (forward.Forwarder over HTTP)."""

    async def run(self, part: Part, traffic_class: str) -> PartResult: ...


@dataclass(frozen=True)
class GatewayRoute(Generic[Req]):
    """A declared route (api/routes.py) bound to the gateway: its request -> its Job; its parts
    go to the pools' `upstream` route (default: the same route; TEI's `/embed` sends
    `/v1/embeddings` parts)."""

    route: Route[Req]
    job: Callable[[Pipeline, Req], Job[Any]]
    upstream: Route[Any] | None = None

    @property
    def upstream_path(self) -> str:
        return (self.upstream or self.route).path

    def __post_init__(self) -> None:
        job = self.job
        if self.route.placement == "split" and isinstance(job, type) and issubclass(job, WholeJob):
            raise TypeError(f"route {self.route.name!r} is split per input: its Job reassembles parts")


class Pipeline:
    """The gateway's state (its config, counter, pools, metrics and part runner) and the stages
    every route runs through (`serve`)."""

    def __init__(
        self,
        config: GatewayConfig,
        counter: TokenCounter,
        upstreams: PoolDirectory,
        metrics: GatewayMetrics,
        forwarder: PartRunner,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        self.counter = counter
        if config.served_model_name:  # refusals name the model as this gateway's clients know it
            counter.model_name = config.served_model_name
        self.upstreams = upstreams
        self.metrics = metrics
        self.forwarder = forwarder
        self.tracing = tracing  # None: tracing off (tracing/__init__.py)
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

    async def serve(
        self,
        bound: GatewayRoute[Req],
        req: Req,
        traffic_class: str,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        charge: Callable[[int], None] | None = None,
    ) -> Answer:
        """One parsed request of a route, as the gateway answers it; `timeout_s`: the client's
        X-Request-Timeout (it shortens the gateway's deadline); `headers`: the client's (its
        traceparent, when tracing is on); `charge(tokens)`: called once its tokens are counted,
        before any pool sees it (a tenant's quota: gateway/tenancy/tenants.py), may refuse it."""
        if self.tracing is None:
            return await self._serve(bound, req, traffic_class, timeout_s, None, charge)
        # The request's span, current while it runs: each upstream call's span is its child.
        attributes = {"embedserve.priority": traffic_class}
        with self.tracing.request(bound.route.name, bound.route.path, headers, attributes) as trace:
            answer = await self._serve(bound, req, traffic_class, timeout_s, trace, charge)
            trace.set({"embedserve.pools": answer[1].get(POOLS_HEADER, "")})
            return answer

    async def _serve(
        self,
        bound: GatewayRoute[Req],
        req: Req,
        traffic_class: str,
        timeout_s: float | None,
        trace: RequestSpan | None,
        charge: Callable[[int], None] | None = None,
    ) -> Answer:
        start = time.perf_counter()
        deadline = self.deadline(timeout_s)
        job = bound.job(self, req)
        pools = self.route_for(traffic_class, job.model)
        name = self.model_name
        counts, placements = await self.place(job, pools, traffic_class)
        if charge is not None:
            charge(sum(counts))
        if trace is not None:
            trace.counted(job.model or name or "", counts)
        if bound.route.placement == "whole":
            parts = [self._whole(job, counts, placements, bound.upstream_path, traffic_class, deadline)]
        else:
            parts = self._split(job, counts, placements, bound.upstream_path, traffic_class, deadline)
        results = await self.run_parts(parts, traffic_class, deadline)
        return job.body(results, counts, name), self.answered(results, start, traffic_class)

    async def place(
        self, job: Job[Any], route: RouteConfig, traffic_class: str
    ) -> tuple[list[int], list[Placement]]:
        """Each input's token count (`job.count()`) and placement; refusals as 400 (too many or
        too long inputs, a bad prompt) or 503 + Retry-After (no pool ready), counted."""
        limit = self.config.max_inputs_per_request
        if job.n_inputs > limit:
            raise too_many_inputs(job.n_inputs, limit)
        try:
            # Tokenizing a long document takes milliseconds: keep it off the event loop.
            counts = await asyncio.to_thread(job.count)
            if not counts:
                raise InvalidInputError("the request holds no inputs")
            placements = place_inputs(counts, route, self._limits, self.upstreams.available(), job.truncate)
        except InputTooLongError as e:
            self.metrics.rejections.labels(traffic_class, "too_long").inc()
            raise ApiError(400, str(e.with_remedy(job.truncate_remedy))) from None
        except InvalidInputError as e:
            raise ApiError(400, str(e)) from None
        except NoPoolAvailable as e:
            self.metrics.rejections.labels(traffic_class, "unavailable").inc()
            retry = str(max(1, round(self.config.health_interval_s)))
            raise ApiError(503, str(e), "service_unavailable", {"Retry-After": retry}) from None
        return counts, placements

    def _split(
        self,
        job: Job[Any],
        counts: Sequence[int],
        placements: Sequence[Placement],
        path: str,
        traffic_class: str,
        deadline: float,
    ) -> list[Part]:
        """One part per group of inputs with the same pools; each input's fallback counted."""
        for p in placements:
            if p.fallback:
                self.metrics.fallbacks.labels(p.preferred, traffic_class, "unavailable").inc()
        return [
            Part(cands, idx, sum(counts[i] for i in idx), job.payload(idx, traffic_class), path, deadline)
            for cands, idx in group_placements(placements)
        ]

    def _whole(
        self,
        job: Job[Any],
        counts: Sequence[int],
        placements: Sequence[Placement],
        path: str,
        traffic_class: str,
        deadline: float,
    ) -> Part:
        """Every input in one part, on the longest input's pools (they fit every input)."""
        longest = placements[max(range(len(counts)), key=counts.__getitem__)]
        if longest.fallback:
            self.metrics.fallbacks.labels(longest.preferred, traffic_class, "unavailable").inc()
        indices = list(range(len(counts)))
        payload = job.payload(indices, traffic_class)
        return Part(longest.candidates, indices, sum(counts), payload, path, deadline)

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

    def answered(self, results: Sequence[PartResult], start: float, traffic_class: str) -> dict[str, str]:
        """A request's latency and gateway overhead observed (`start`: its time.perf_counter()
        on arrival); its response headers."""
        total = time.perf_counter() - start
        upstream = max(r.elapsed for r in results)
        self.metrics.latency.labels(traffic_class).observe(total)
        self.metrics.overhead.labels(traffic_class).observe(max(total - upstream, 0.0))
        return response_headers(results, upstream, total)


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
