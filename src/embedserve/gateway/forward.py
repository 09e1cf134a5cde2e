"""Send one part of a request (inputs that share their candidate pools) to an upstream.

Pools are tried in the placement's order and, within a pool, its upstreams in rotation, best
first. Saturation (429), unavailability (503) and connection errors move on to the next
upstream or pool: embedding is idempotent, so re-sending a part can never duplicate anything.
Any other answer ends the part: a 4xx is the caller's fault, the rest is the upstream's (502).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from embedserve.api.protocol import ApiError
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.upstreams import Pool, Upstream, UpstreamSet

log = logging.getLogger(__name__)

# Caller errors an upstream may find that the gateway did not (bad ids, dimensions, ...).
_CALLER_STATUSES = (400, 404, 413, 422)
_RETRYABLE = (429, 503)


@dataclass(frozen=True)
class Part:
    candidates: tuple[str, ...]
    indices: list[int]  # positions in the client's request
    tokens: int
    payload: dict[str, Any]  # request body for the upstream


@dataclass(frozen=True)
class Refusal:
    status: int  # 429 / 503 from the upstream; 503 when it could not be reached
    retry_after: int
    reason: str  # "rejected" or "unreachable" (fallback metric label)


@dataclass(frozen=True)
class PartResult:
    part: Part
    pool: str
    body: dict[str, Any]
    headers: Mapping[str, str]  # the upstream's timing headers (x-queue-time, ...)
    elapsed: float  # seconds of the successful upstream call


class Forwarder:
    def __init__(self, upstreams: UpstreamSet, metrics: GatewayMetrics, policy: str) -> None:
        self.upstreams = upstreams
        self.metrics = metrics
        self.policy = policy

    async def run(self, part: Part, traffic_class: str) -> PartResult:
        refusals: list[Refusal] = []
        for name in part.candidates:
            pool = self.upstreams.pools[name]
            reason = "unavailable"
            for up in pool.choose(self.policy):
                result = await self._attempt(part, pool, up, traffic_class)
                if isinstance(result, PartResult):
                    return result
                refusals.append(result)
                reason = result.reason
            if name != part.candidates[-1]:
                self.metrics.fallbacks.labels(name, traffic_class, reason).inc()
        # Every candidate refused or was unreachable: the client may retry later.
        wait = str(max((r.retry_after for r in refusals), default=1))
        saw_429 = any(r.status == 429 for r in refusals)
        status, kind = (429, "rate_limit_error") if saw_429 else (503, "service_unavailable")
        raise ApiError(
            status,
            f"no capacity for inputs {part.indices} in pools {list(part.candidates)}; retry in {wait} s",
            kind,
            {"Retry-After": wait},
        )

    async def _attempt(
        self, part: Part, pool: Pool, up: Upstream, traffic_class: str
    ) -> PartResult | Refusal:
        count = self.metrics.pool_requests
        up.outstanding_tokens += part.tokens
        start = time.perf_counter()
        try:
            r = await self.upstreams.client.post(f"{up.url}/v1/embeddings", json=part.payload)
        except (httpx.NetworkError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
            # Never reached, or dropped the connection before answering (killed, restarted).
            reason = f"connection failed: {type(e).__name__}: {e}"
            log.warning("upstream %s (pool %r): %s; trying the next one", up.url, pool.name, reason)
            self.upstreams.mark_down(up.url, reason)
            count.labels(pool.name, traffic_class, "unreachable").inc()
            return Refusal(503, 1, "unreachable")
        except httpx.TimeoutException as e:
            count.labels(pool.name, traffic_class, "failed").inc()
            raise ApiError(
                504,
                f"pool {pool.name!r} ({up.url}) did not answer in time: {type(e).__name__}",
                "server_error",
            ) from None
        finally:
            up.outstanding_tokens -= part.tokens
        elapsed = time.perf_counter() - start
        if r.status_code == 200:
            result = PartResult(part, pool.name, _embeddings_body(r, pool, part), r.headers, elapsed)
            count.labels(pool.name, traffic_class, "ok").inc()
            self.metrics.pool_inputs.labels(pool.name, traffic_class).inc(len(part.indices))
            self.metrics.pool_tokens.labels(pool.name, traffic_class).inc(part.tokens)
            self.metrics.pool_latency.labels(pool.name, traffic_class).observe(elapsed)
            return result
        if r.status_code in _RETRYABLE:
            count.labels(pool.name, traffic_class, "rejected").inc()
            return Refusal(r.status_code, _retry_after(r), "rejected")
        count.labels(pool.name, traffic_class, "failed").inc()
        raise _upstream_error(r, pool, up, part.indices)


def _embeddings_body(r: httpx.Response, pool: Pool, part: Part) -> dict[str, Any]:
    try:
        body: dict[str, Any] = r.json()
        data = body["data"]
        ok = isinstance(data, list) and sorted(d["index"] for d in data) == list(range(len(part.indices)))
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ApiError(
            502,
            f"pool {pool.name!r} answered 200 without one embedding per input: {r.text[:200]}",
            "server_error",
        )
    return body


def _upstream_error(r: httpx.Response, pool: Pool, up: Upstream, indices: Sequence[int]) -> ApiError:
    try:
        message = str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = r.text[:300]
    where = (
        f"pool {pool.name!r} ({up.url}, request inputs {list(indices)} as its inputs 0..{len(indices) - 1})"
    )
    if r.status_code in _CALLER_STATUSES:
        return ApiError(r.status_code, f"{where}: {message}")
    return ApiError(502, f"{where} failed with HTTP {r.status_code}: {message}", "server_error")


def _retry_after(r: httpx.Response) -> int:
    value = r.headers.get("retry-after", "")
    return int(value) if value.isdigit() else 1
