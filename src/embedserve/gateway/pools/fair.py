"""Fair share by tokens at a saturated pool (#46): a pool with `max_inflight_tokens` keeps at most
that many tokens in flight to its upstreams; parts beyond it wait here, and the next to go is
chosen by

    start tag   (batch parts; online parts never wait here: they go at once and count as in
                 flight, so batch parts wait while they run: the online/batch order stays
                 above fairness)

where the start tag is start-time fair queueing over tokens: a part of `n` tokens from a tenant of
weight `w` arriving at virtual time V starts at max(V, that tenant's last finish) and finishes
`n / w` later; V is the start tag of the part that went last. Tenants with work waiting are then
served tokens in proportion to their weights whatever their request sizes (a tenant sending 8K-
token documents does not get 100x one sending queries), a tenant under its share never waits
behind another's backlog (its tag is the current virtual time), and a tenant idle for a while
gets no credit for it. Parts without a tenant (the gateway's own keys, no `tenants:` map) count
as one tenant of weight 1.

A part larger than the whole allowance goes alone once nothing is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

# The tenant a request runs for (name, weight), set by gateway/tenancy/tenants.py for its parts.
CURRENT_TENANT: ContextVar[tuple[str, float] | None] = ContextVar("embedserve_tenant", default=None)
_NO_TENANT = ("", 1.0)
# Where a request's parts report the seconds they waited at a pool's gate (online: 0), set by
# gateway/tenancy/tenants.py: the tenant's queue-time histogram.
QUEUE_OBSERVER: ContextVar[Callable[[float], None] | None] = ContextVar("embedserve_queue", default=None)


@dataclass(order=True)
class _Waiter:
    key: tuple[float, int]  # (start tag, arrival)
    tokens: int = field(compare=False)
    tenant: str = field(compare=False)
    finish: float = field(compare=False)
    ready: asyncio.Future[None] = field(compare=False)


class FairGate:
    def __init__(self, max_inflight_tokens: int) -> None:
        self.capacity = max_inflight_tokens
        self.inflight = 0
        self.virtual = 0.0
        self._finish: dict[str, float] = {}  # each tenant's last finish tag
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()

    def resize(self, max_inflight_tokens: int) -> FairGate:
        """A reloaded pool's new limit on this gate: the parts in flight and waiting still count
        (a reload never doubles what a pool is sent); a larger limit lets waiters go at once."""
        self.capacity = max_inflight_tokens
        self._wake()
        return self

    @property
    def waiting(self) -> int:
        return len(self._heap)

    @contextlib.asynccontextmanager
    async def slot(self, tokens: int, traffic_class: str) -> AsyncIterator[float]:
        """Hold `tokens` of the pool's allowance while the body runs; yields the seconds waited."""
        began, observe = time.monotonic(), QUEUE_OBSERVER.get()
        if traffic_class == "online":
            self.inflight += tokens
            try:
                if observe is not None:
                    observe(0.0)
                yield 0.0
            finally:
                self._release(tokens)
            return
        tenant, weight = CURRENT_TENANT.get() or _NO_TENANT
        start = max(self.virtual, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + tokens / weight
        if self._heap or not self._fits(tokens):
            ready = asyncio.get_running_loop().create_future()
            waiter = _Waiter((start, next(self._seq)), tokens, tenant, self._finish[tenant], ready)
            heapq.heappush(self._heap, waiter)
            try:
                await ready
            except BaseException:
                if not ready.done() or ready.cancelled():
                    self._drop(waiter)
                else:  # granted as it was cancelled: hand the allowance on
                    self._release(tokens)
                raise
        else:
            self._take(tokens, start)
        try:
            waited = time.monotonic() - began
            if observe is not None:
                observe(waited)
            yield waited
        finally:
            self._release(tokens)

    def _fits(self, tokens: int) -> bool:
        return self.inflight == 0 or self.inflight + tokens <= self.capacity

    def _take(self, tokens: int, start: float) -> None:
        self.inflight += tokens
        self.virtual = max(self.virtual, start)

    def _release(self, tokens: int) -> None:
        self.inflight -= tokens
        self._wake()

    def _drop(self, waiter: _Waiter) -> None:
        """A waiter gone (its deadline, its client): out of the queue, and its tokens no longer
        count against its tenant where it was the tenant's last part."""
        with contextlib.suppress(ValueError):
            self._heap.remove(waiter)
            heapq.heapify(self._heap)
        if self._finish.get(waiter.tenant) == waiter.finish:
            self._finish[waiter.tenant] = waiter.key[0]
        self._wake()

    def _wake(self) -> None:
        """Grant waiters in order while the head fits (head of line: fairness over packing)."""
        while self._heap and self._fits(self._heap[0].tokens):
            waiter = heapq.heappop(self._heap)
            if waiter.ready.done():
                continue
            self._take(waiter.tokens, waiter.key[0])
            waiter.ready.set_result(None)


@contextlib.asynccontextmanager
async def allowance(
    gate: FairGate | None, tokens: int, traffic_class: str, waited: Callable[[float], None]
) -> AsyncIterator[None]:
    """A pool's allowance of `tokens` in flight where it has a gate (else nothing to wait for);
    `waited(seconds)` is told the wait (the pool's queue-time metric)."""
    if gate is None:
        yield
        return
    async with gate.slot(tokens, traffic_class) as seconds:
        waited(seconds)
        yield
