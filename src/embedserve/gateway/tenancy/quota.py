"""A tenant quota's token bucket (gateway/tenancy/tenants.py): refilled continuously, a minute's worth at
most, a take larger than that waiting for a full bucket and leaving it in debt."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class Bucket:
    """Refilled continuously at `per_minute` a minute, holding at most a minute's worth. A take
    larger than that waits for a full bucket and leaves it in debt (it is never refused forever)."""

    def __init__(self, per_minute: int, clock: Clock = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self.level = self.capacity
        self.clock = clock
        self._at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self._at) * self.rate)
        self._at = now

    def wait_s(self, n: int) -> float:
        """0 when `n` may be taken now, else the seconds until it may."""
        self._refill()
        need = min(float(n), self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, n: int) -> None:
        self._refill()
        self.level -= n


def quota_bucket(current: Bucket | None, per_minute: int | None, clock: Clock) -> Bucket | None:
    """The bucket of a quota of `per_minute` (None: no quota), kept if its size did not change
    (a reload keeps what was taken)."""
    if per_minute is None:
        return None
    if current is not None and current.capacity == per_minute:
        return current
    return Bucket(per_minute, clock)
