"""Send one part of a request (inputs that share their candidate pools) to an upstream.

Pools are tried in the placement's order and, within a pool, its upstreams in rotation, best
first. Saturation (429), unavailability (503) and connection errors move on to the next
upstream or pool: embedding is idempotent, so re-sending a part can never duplicate anything.
Any other answer ends the part: a 4xx is the caller's fault, the rest is the upstream's (502).

A request that fails on a reused keep-alive connection before any answer came back is sent
again at once, to the same upstream, on another connection: the pool most likely closed that
connection idle as it was reused (api/keepalive.py), which says nothing about its health. Only
a failure on a fresh connection takes the upstream out of rotation.

Deadlines (api/deadline.py): each call carries `X-Request-Timeout`, the time left of the client
request's end-to-end deadline; when it has passed, or an upstream answers 503
`deadline_exceeded` (the request's time ran out in its queue), the part ends at once with 504:
trying another pool would only make the client wait a second time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from httpx._client import UseClientDefault

from embedserve.api.deadline import DEADLINE_EXCEEDED, TIMEOUT_HEADER, is_deadline_error
from embedserve.api.keepalive import MAX_RETRY_AFTER_S
from embedserve.api.protocol import ApiError
from embedserve.api.routes import EMBEDDINGS_PATH, route_at
from embedserve.gateway.pools.fair import allowance
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.upstreams import Pool, Upstream, UpstreamSet

if TYPE_CHECKING:
    from embedserve.tracing.otel import Tracing

log = logging.getLogger(__name__)

# Caller errors an upstream may find that the gateway did not (bad ids, dimensions, ...).
_CALLER_STATUSES = (400, 404, 413, 422)
_RETRYABLE = (429, 503)
# Past the deadline, an upstream call gets this much longer to send the server's own 503.
_GRACE_S = 1.0
# The time left, less this (at most a tenth of it), is what an upstream is told it has.
_MARGIN_S = 0.25
# Resends of one request after failures on reused connections (each failure drops that connection).
_STALE_RESENDS = 2
# What a connection that broke without an answer raises (a refused connect is ConnectError).
_BROKEN = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class Part:
    candidates: tuple[str, ...]
    indices: list[int]  # positions in the client's request
    tokens: int
    payload: dict[str, Any]  # request body for the upstream
    path: str = EMBEDDINGS_PATH  # the upstream route (/v1/embeddings, /v2/embed, /v1/rerank)
    deadline: float | None = None  # time.monotonic() by which the client must be answered


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
    def __init__(
        self, upstreams: UpstreamSet, metrics: GatewayMetrics, policy: str, tracing: Tracing | None = None
    ) -> None:
        self.upstreams = upstreams
        self.metrics = metrics
        self.policy = policy
        self.tracing = tracing  # None: tracing off (tracing/__init__.py)

    async def run(self, part: Part, traffic_class: str) -> PartResult:
        refusals: list[Refusal] = []
        for name in part.candidates:
            pool = self.upstreams.pools[name]
            queue = self.metrics.pool_queue.labels(name, traffic_class)
            async with allowance(pool.gate, part.tokens, traffic_class, queue.observe):
                reason = "unavailable"
                for up in pool.choose(self.policy):
                    check_deadline(part, name)
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
        headers, timeout = _deadline_headers(part)
        try:
            r = await self._send(f"{up.url}{part.path}", part, pool.name, headers, timeout)
        except (httpx.NetworkError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
            # Never reached, or dropped the connection before answering (killed, restarted).
            reason = f"connection failed: {type(e).__name__}: {e}"
            log.warning("upstream %s (pool %r): %s; trying the next one", up.url, pool.name, reason)
            self.upstreams.mark_down(up.url, reason)
            count.labels(pool.name, traffic_class, "unreachable").inc()
            return Refusal(503, 1, "unreachable")
        except httpx.TimeoutException as e:
            count.labels(pool.name, traffic_class, "failed").inc()
            if part.deadline is not None and time.monotonic() >= part.deadline:
                raise deadline_error(part, f"pool {pool.name!r} ({up.url}) did not answer in time") from None
            raise ApiError(
                504,
                f"pool {pool.name!r} ({up.url}) did not answer in time: {type(e).__name__}",
                "server_error",
            ) from None
        finally:
            up.outstanding_tokens -= part.tokens
        elapsed = time.perf_counter() - start
        if r.status_code == 200:
            result = PartResult(part, pool.name, _checked_body(r, pool, part), r.headers, elapsed)
            count.labels(pool.name, traffic_class, "ok").inc()
            self.metrics.pool_inputs.labels(pool.name, traffic_class).inc(len(part.indices))
            self.metrics.pool_tokens.labels(pool.name, traffic_class).inc(part.tokens)
            self.metrics.pool_latency.labels(pool.name, traffic_class).observe(elapsed)
            return result
        if r.status_code == 503 and is_deadline_error(_json(r)):
            count.labels(pool.name, traffic_class, "failed").inc()
            raise deadline_error(part, f"pool {pool.name!r} ({up.url}): {_message(r)}")
        if r.status_code in _RETRYABLE:
            count.labels(pool.name, traffic_class, "rejected").inc()
            return Refusal(r.status_code, retry_after(r.headers.get("retry-after")), "rejected")
        count.labels(pool.name, traffic_class, "failed").inc()
        raise _upstream_error(r, pool, up, part.indices)

    async def _send(
        self, url: str, part: Part, pool: str, headers: dict[str, str], timeout: float | UseClientDefault
    ) -> httpx.Response:
        """The call, in a CLIENT span whose traceparent goes along when tracing is on. A LoRA
        adapter's part names it (other parts leave `model` to the pool: its own name)."""
        adapter = self.upstreams.config.adapter
        payload = part.payload if adapter is None else {**part.payload, "model": adapter}
        if self.tracing is None:
            return await self._post(url, payload, headers, timeout)
        with self.tracing.upstream(url, pool, len(part.indices), part.tokens, headers) as call:
            r = await self._post(url, payload, headers, timeout)
            call.status = r.status_code
            return r

    async def _post(
        self, url: str, payload: dict[str, Any], headers: dict[str, str], timeout: float | UseClientDefault
    ) -> httpx.Response:
        """POST, resent when it broke on a reused connection before any answer (see above)."""
        client = self.upstreams.client
        for _ in range(_STALE_RESENDS):
            trace = _ConnectionTrace()
            try:
                return await client.post(
                    url, json=payload, headers=headers, timeout=timeout, extensions={"trace": trace}
                )
            except _BROKEN as e:
                if trace.connected or trace.answered:
                    raise
                log.info("%s: reused connection closed without an answer (%s: %s); resending", url,
                         type(e).__name__, e)  # fmt: skip
        return await client.post(url, json=payload, headers=headers, timeout=timeout)


class _ConnectionTrace:
    """httpcore's trace events of one request: did it open a connection, did an answer begin."""

    def __init__(self) -> None:
        self.connected = False
        self.answered = False

    async def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        if event.startswith("connection.connect_tcp."):
            self.connected = True
        elif event.endswith(".receive_response_headers.complete"):
            self.answered = True


def _checked_body(r: httpx.Response, pool: Pool, part: Part) -> dict[str, Any]:
    """The upstream's 200 body, if it holds one answer per input of the part (else 502)."""
    body = _json(r)
    if not answers_every_input(body, part):
        raise ApiError(
            502,
            f"pool {pool.name!r} answered 200 without one answer per input: {r.text[:200]}",
            "server_error",
        )
    result: dict[str, Any] = body
    return result


def answers_every_input(body: Any, part: Part) -> bool:
    """Whether a 200 body of the part's route holds one answer per input of the part (the
    route's own rule: api/routes.py)."""
    route = route_at(part.path)
    if route is None:
        return False
    try:
        return route.answers(body, len(part.indices))
    except (KeyError, TypeError, AttributeError):
        return False


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


def check_deadline(part: Part, pool: str) -> None:
    """504 `deadline_exceeded` when the part's deadline has passed: it is not sent (again)."""
    if part.deadline is not None and time.monotonic() >= part.deadline:
        raise deadline_error(part, f"no time left to try pool {pool!r}")


def time_to_tell(deadline: float, now: float) -> float:
    """What a pool is told it has (X-Request-Timeout): the time left, less a margin for the
    answer's way back, so that the pool's own deadline answer (naming the pool) beats ours."""
    left = max(deadline - now, 0.001)
    return left - min(_MARGIN_S, left / 10)


def _deadline_headers(part: Part) -> tuple[dict[str, str], float | UseClientDefault]:
    """X-Request-Timeout (`time_to_tell`) and the call's own limit, a little over the time
    left. No deadline: none sent, the client's timeout."""
    if part.deadline is None:
        return {}, httpx.USE_CLIENT_DEFAULT
    now = time.monotonic()
    told = time_to_tell(part.deadline, now)
    return {TIMEOUT_HEADER: f"{told:.3f}"}, max(part.deadline - now, 0.001) + _GRACE_S


def deadline_error(part: Part, detail: str) -> ApiError:
    return ApiError(
        504,
        f"inputs {part.indices}: the request's deadline passed ({detail}); not retried on "
        "another pool: retry later or with a longer timeout",
        DEADLINE_EXCEEDED,
    )


def _upstream_error(r: httpx.Response, pool: Pool, up: Upstream, indices: Sequence[int]) -> ApiError:
    message = _message(r)
    where = (
        f"pool {pool.name!r} ({up.url}, request inputs {list(indices)} as its inputs 0..{len(indices) - 1})"
    )
    if r.status_code in _CALLER_STATUSES:
        return ApiError(r.status_code, f"{where}: {message}")
    return ApiError(502, f"{where} failed with HTTP {r.status_code}: {message}", "server_error")


def retry_after(value: str | None) -> int:
    """A pool's Retry-After in seconds, at most MAX_RETRY_AFTER_S (below the gateway's
    keep-alive: api/keepalive.py); 1 when absent or not a number of seconds."""
    value = (value or "").strip()
    return min(int(value), MAX_RETRY_AFTER_S) if value.isdigit() else 1
