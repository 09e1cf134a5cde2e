"""The one priority policy both queues use (the scheduler's and the layer-major lane's).

Requests order by key = (class, arrival): `online` before `batch`, then first come, first
served. A batch request counts as online once its queue's clock ticked `aging_steps` times
since it arrived or last got work, so a stream of online work cannot starve it. Each queue keeps its own clock
(the scheduler ticks once per step; the lane once per step in which online work went before
its prompts) but the stamp, the aging rule and the key are these.
"""

from __future__ import annotations

import time

from embedserve.request import Priority, Request


class PriorityClock:
    def __init__(self, aging_steps: int) -> None:
        if aging_steps < 0:
            raise ValueError(f"aging_steps must be >= 0, got {aging_steps}")
        self.aging_steps = aging_steps
        self.ticks = 0
        self._next_seq = 0

    def stamp(self, req: Request) -> None:
        """Record an arrival: its order among this queue's requests and the clock's time."""
        req.arrival_seq, req.arrival_step = self._next_seq, self.ticks
        self._next_seq += 1

    def tick(self) -> None:
        self.ticks += 1

    def progressed(self, req: Request) -> None:
        """`req` got work this step: its age counts from now (a batch request ages while it waits,
        not while it advances in short batch steps)."""
        req.arrival_step = self.ticks

    def is_online(self, req: Request) -> bool:
        """Online by request or by age."""
        return req.priority is Priority.ONLINE or self.ticks - req.arrival_step >= self.aging_steps

    def key(self, req: Request) -> tuple[int, int]:
        return (0 if self.is_online(req) else 1), req.arrival_seq


def moving_average(previous: float | None, value: float, weight: float = 0.2) -> float:
    """Exponential moving average; the first value stands alone."""
    return value if previous is None else (1 - weight) * previous + weight * value


RESPONSIVE_WINDOW_S = 10.0  # online requests this recent keep batch steps (and lane units) short
# While online requests come, a step of batch work alone is sized to about this share of the time
# an online step took: an online request arriving meanwhile waits at most that long for it.
RESPONSIVE_SHARE = 0.5
MIN_RESPONSIVE_TOKENS = 16


class BatchAllowance:
    """How many tokens of a step batch work may take (the scheduler's rule, measured here):

    - no online work waits and none came in the last RESPONSIVE_WINDOW_S: the whole budget;
    - online work waits or came lately: about RESPONSIVE_SHARE of an online step's time, in
      tokens at the rate steps ran at lately (at least MIN_RESPONSIVE_TOKENS, at most `cap`:
      batch_tokens_with_online; `cap` itself until steps were timed), so an online request's own
      step stays short and so does the step it arrives during.

    A step that would otherwise hold nothing still runs the first batch request (whole, for a
    model that cannot cut a prompt into chunks): batch work never stops while online is idle."""

    def __init__(self, budget: int, cap: int) -> None:
        self.budget = budget
        self.cap = cap
        self.last_online_s: float | None = None  # when online work last waited at a step
        self.online_step_s: float | None = None  # how long such steps took, moving average
        self.tokens_per_s: float | None = None  # the rate steps ran at, moving average

    def observe(self, online: bool, tokens: int, seconds: float) -> None:
        if online:
            self.last_online_s = time.monotonic()
            self.online_step_s = moving_average(self.online_step_s, seconds)
        if tokens and seconds > 0:
            self.tokens_per_s = moving_average(self.tokens_per_s, tokens / seconds)

    def recent(self) -> bool:
        last = self.last_online_s
        return last is not None and time.monotonic() - last <= RESPONSIVE_WINDOW_S

    def tokens(self, online_queued: bool) -> int:
        if not online_queued and not self.recent():
            return self.budget
        if self.online_step_s is None or self.tokens_per_s is None:
            return self.cap
        sized = int(RESPONSIVE_SHARE * self.online_step_s * self.tokens_per_s)
        return max(MIN_RESPONSIVE_TOKENS, min(self.cap, sized))
