"""The ingress deployment: the gateway's app and service in front of pool deployments.

Counting, placement (smallest pool that fits, route order, online/batch), split and ordered
reassembly, the schema guard and the HTTP API are the gateway's own code (embedserve.gateway);
this module only supplies what differs from HTTP upstreams:

- ServePools (a PoolDirectory): which pools can take work, polled from each deployment's
  replica cards and judged by the gateway's guard (one "upstream" per pool: its deployment).
- ServeRunner (a PartRunner): a part (`/v1/embeddings` and `/v2/embed` split per pool,
  `/v1/rerank` whole: gateway/routes/pipeline.py) goes to its pool's
  deployment handle, which runs the server's handler for that route (scale/replica.py). If
  the replica dies under it, the part is retried once (Serve routes the retry to another
  replica), then the next candidate pool; if none can take it the client gets 503 (a pool's
  Retry-After relayed at most 60 s, as the gateway relays it). Never a silent loss.

Deadlines as in gateway/pools/forward.py: every call carries the time left of the request's deadline
(the replica's X-Request-Timeout); a part whose deadline has passed is not sent, nor retried on
another replica or pool (504 `deadline_exceeded`), and a replica's deadline 503 is answered 504
at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from embedserve.api.deadline import is_deadline_error
from embedserve.api.protocol import ApiError
from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.gateway.pools.fair import FairGate, allowance
from embedserve.gateway.pools.forward import (
    Part,
    PartResult,
    Refusal,
    answers_every_input,
    check_deadline,
    deadline_error,
    retry_after,
    time_to_tell,
)
from embedserve.gateway.pools.guard import UpstreamReport, choose_schema, exclusion, startup_conflict
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.scale.config import ScaleConfig

log = logging.getLogger(__name__)

_CARD_TIMEOUT_S = 5.0
_RETRYABLE = (429, 503)


def _replica_failures() -> tuple[type[BaseException], ...]:
    """What a handle call raises when the replica serving it died or became unreachable."""
    from ray import exceptions as rex

    return tuple(
        getattr(rex, name)
        for name in ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError")
        if hasattr(rex, name)
    )


class ServePools:
    """PoolDirectory over Serve deployments, refreshed by `poll`."""

    def __init__(self, config: ScaleConfig, handles: Mapping[str, Any]) -> None:
        self.config = config.gateway
        self.handles = handles
        self.reports: dict[str, UpstreamReport] = {}
        self.reasons: dict[str, str | None] = {p.name: "not polled yet" for p in self.config.pools}
        self.schema: str | None = None
        # Tokens in flight to a pool with max_inflight_tokens; more wait, fairly (gateway/pools/fair.py).
        self.gates = {
            p.name: FairGate(p.max_inflight_tokens) for p in self.config.pools if p.max_inflight_tokens
        }

    async def start(self) -> None:
        reports = await self._probe_all()
        conflict = startup_conflict(self.config.pools, reports)
        if conflict is not None:
            raise GatewayConfigError(conflict)
        self._apply(reports)

    async def poll(self) -> None:
        self._apply(await self._probe_all())

    async def _probe_all(self) -> dict[str, UpstreamReport]:
        pools = self.config.pools
        reports = await asyncio.gather(*(self._probe(p.name) for p in pools))
        return {p.upstreams[0]: r for p, r in zip(pools, reports, strict=True)}

    async def _probe(self, pool: str) -> UpstreamReport:
        try:
            card: dict[str, Any] = await asyncio.wait_for(
                _awaitable(self.handles[pool].card.remote()), _CARD_TIMEOUT_S
            )
        except Exception as e:  # no replica ready in time, or the call failed
            return UpstreamReport(ready=False, error=f"no ready replica: {type(e).__name__}: {e}")
        schema, limit = card.get("embedding_schema"), card.get("max_model_len")
        return UpstreamReport(
            ready=True,
            schema=schema if isinstance(schema, str) else None,
            max_model_len=limit if isinstance(limit, int) else None,
            card=card,
        )

    def _apply(self, reports: dict[str, UpstreamReport]) -> None:
        self.reports.update(reports)
        if self.schema is None:
            self.schema = choose_schema(self.config.pools, self.reports)
        for p in self.config.pools:
            reason = exclusion(p, self.schema, self.reports[p.upstreams[0]])
            if reason != self.reasons[p.name]:
                log.log(
                    logging.INFO if reason is None else logging.WARNING, "pool %r: %s", p.name, reason or "ok"
                )
            self.reasons[p.name] = reason

    def mark_down(self, pool: str, reason: str) -> None:
        self.reasons[pool] = reason

    def available(self) -> set[str]:
        return {name for name, reason in self.reasons.items() if reason is None}

    def model_card(self) -> dict[str, Any] | None:
        for p in self.config.pools:
            if self.reasons[p.name] is None:
                card = dict(self.reports[p.upstreams[0]].card)
                card.pop("replica", None)
                return card
        return None

    def describe(self) -> dict[str, Any]:
        return {
            p.name: {
                "max_tokens": p.max_tokens,
                "classes": sorted(p.classes),
                "available": self.reasons[p.name] is None,
                "deployment": p.upstreams[0].removeprefix("serve:"),
                "detail": self.reasons[p.name] or "ok",
            }
            for p in self.config.pools
        }


class ServeRunner:
    """PartRunner over deployment handles (see the module docstring for the retry rule)."""

    def __init__(self, pools: ServePools, metrics: GatewayMetrics) -> None:
        self.pools = pools
        self.metrics = metrics
        self.failures = _replica_failures()

    async def run(self, part: Part, traffic_class: str) -> PartResult:
        refusals: list[Refusal] = []
        for name in part.candidates:
            queue = self.metrics.pool_queue.labels(name, traffic_class)
            async with allowance(self.pools.gates.get(name), part.tokens, traffic_class, queue.observe):
                result = await self._on_pool(part, name, traffic_class)
            if isinstance(result, PartResult):
                return result
            refusals.append(result)
            if name != part.candidates[-1]:
                self.metrics.fallbacks.labels(name, traffic_class, result.reason).inc()
        wait = str(max((r.retry_after for r in refusals), default=1))
        status, kind = (
            (429, "rate_limit_error")
            if any(r.status == 429 for r in refusals)
            else (503, "service_unavailable")
        )
        raise ApiError(
            status,
            f"no capacity for inputs {part.indices} in pools {list(part.candidates)}; retry in {wait} s",
            kind,
            {"Retry-After": wait},
        )

    async def _on_pool(self, part: Part, name: str, traffic_class: str) -> PartResult | Refusal:
        count = self.metrics.pool_requests
        for attempt in (1, 2):
            check_deadline(part, name)  # expired: not sent, not retried on another replica
            told = None if part.deadline is None else time_to_tell(part.deadline, time.monotonic())
            start = time.perf_counter()
            try:
                handle = self.pools.handles[name]
                reply: dict[str, Any] = await handle.request.remote(part.path, part.payload, told)
            except self.failures as e:
                count.labels(name, traffic_class, "unreachable").inc()
                log.warning(
                    "pool %r: replica failed under inputs %s (attempt %d): %s", name, part.indices, attempt, e
                )
                continue  # Serve routes the retry to a live replica
            elapsed = time.perf_counter() - start
            status = int(reply["status"])
            if status == 200:
                return self._accept(part, name, reply, elapsed, traffic_class)
            headers = reply.get("headers") or {}
            if status == 503 and is_deadline_error(reply["body"]):  # not retried (api/deadline.py)
                count.labels(name, traffic_class, "failed").inc()
                raise deadline_error(part, f"pool {name!r}: {reply['body']['error']['message']}")
            if status in _RETRYABLE:
                count.labels(name, traffic_class, "rejected").inc()
                wait = retry_after(headers.get("Retry-After") or headers.get("retry-after"))
                return Refusal(status, wait, "rejected")
            count.labels(name, traffic_class, "failed").inc()
            message = reply["body"].get("error", {}).get("message", "")
            where = f"pool {name!r} (request inputs {part.indices} as its inputs 0..{len(part.indices) - 1})"
            if status in (400, 404, 413, 422):
                raise ApiError(status, f"{where}: {message}")
            raise ApiError(502, f"{where} failed with HTTP {status}: {message}", "server_error")
        return Refusal(503, 1, "unreachable")

    def _accept(
        self, part: Part, name: str, reply: dict[str, Any], elapsed: float, traffic_class: str
    ) -> PartResult:
        body: dict[str, Any] = reply["body"]
        expected, schema = self.pools.schema, reply.get("embedding_schema")
        if expected is not None and schema != expected:
            # A replica with other weights or settings: never mix its vectors in. (The body's
            # own schema is the request's: `dimensions` or a compressed type name another one.)
            self.pools.mark_down(name, f"SCHEMA MISMATCH: a replica serves {schema}")
            raise ApiError(502, f"pool {name!r} answered with another embedding schema", "server_error")
        if not answers_every_input(body, part):
            self.metrics.pool_requests.labels(name, traffic_class, "failed").inc()
            raise ApiError(502, f"pool {name!r} answered 200 without one answer per input", "server_error")
        self.metrics.pool_requests.labels(name, traffic_class, "ok").inc()
        self.metrics.pool_inputs.labels(name, traffic_class).inc(len(part.indices))
        self.metrics.pool_tokens.labels(name, traffic_class).inc(part.tokens)
        self.metrics.pool_latency.labels(name, traffic_class).observe(elapsed)
        return PartResult(part, name, body, reply.get("headers") or {}, elapsed)


async def _awaitable(response: Any) -> Any:
    return await response
