"""Backpressure: a hard bound on the work the server holds, and a throughput estimate.

A request is admitted or refused as a whole, before anything is queued in the engine, so an
overloaded server answers 429 quickly instead of growing an unbounded queue. Everything here
runs on the event loop thread, so plain counters suffice.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

from embedserve.api.keepalive import MAX_RETRY_AFTER_S


@dataclass(frozen=True)
class Ticket:
    """Proof of admission; hand it back to `Admission.release` exactly once."""

    inputs: int
    tokens: int


class ThroughputMeter:
    """Tokens finished per second over a sliding window (for Retry-After and /metrics)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._sum = 0

    def add(self, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._events.append((now, tokens))
        self._sum += tokens
        self._expire(now)

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._expire(now)
        if not self._events:
            return 0.0
        # Measure over the span actually observed (at least 1 s) so a lone burst is not
        # extrapolated into a huge rate.
        span = max(now - self._events[0][0], 1.0)
        return self._sum / span

    def _expire(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self.window_s:
            self._sum -= self._events.popleft()[1]


class Admission:
    def __init__(self, max_inputs: int, max_tokens: int, meter: ThroughputMeter) -> None:
        if max_inputs < 1 or max_tokens < 1:
            raise ValueError("queue bounds must be >= 1")
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self.meter = meter
        self.inputs = 0
        self.tokens = 0

    def fits_ever(self, inputs: int, tokens: int) -> bool:
        """False when a request exceeds the bounds on its own: retrying can never help."""
        return inputs <= self.max_inputs and tokens <= self.max_tokens

    def try_admit(self, inputs: int, tokens: int) -> Ticket | None:
        if self.inputs + inputs > self.max_inputs or self.tokens + tokens > self.max_tokens:
            return None
        self.inputs += inputs
        self.tokens += tokens
        return Ticket(inputs, tokens)

    def release(self, ticket: Ticket) -> None:
        self.inputs -= ticket.inputs
        self.tokens -= ticket.tokens

    def retry_after(self) -> int:
        """Whole seconds until the held work should have drained (1..MAX_RETRY_AFTER_S)."""
        rate = self.meter.rate()
        if rate <= 0:
            return 1
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(self.tokens / rate)))
