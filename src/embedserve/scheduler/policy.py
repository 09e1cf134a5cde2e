"""The one priority policy both queues use (the scheduler's and the layer-major lane's).

Requests order by key = (class, arrival): `online` before `batch`, then first come, first
served. A batch request counts as online once its queue's clock ticked `aging_steps` times
since it arrived, it last got work, or batch work last got any (`progressed`), so a stream of
online work cannot starve it. Batch requests waiting behind their own class's earlier ones
(first come, first served among them) do not age: otherwise a window of batch lines fed a few
tokens a step beside online queries aged together and ran as online work, whole steps of
them at once, the very steps the online queries then waited behind. Each queue keeps its own clock
(the scheduler ticks once per step; the lane once per step in which online work went before
its prompts) but the stamp, the aging rule and the key are these.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from embedserve.request import Priority, Request


class PriorityClock:
    def __init__(self, aging_steps: int) -> None:
        if aging_steps < 0:
            raise ValueError(f"aging_steps must be >= 0, got {aging_steps}")
        self.aging_steps = aging_steps
        self.ticks = 0
        self._next_seq = 0
        self._batch_progress = -1  # the tick at which batch work last got work

    def stamp(self, req: Request) -> None:
        """Record an arrival: its order among this queue's requests and the clock's time."""
        req.arrival_seq, req.arrival_step = self._next_seq, self.ticks
        self._next_seq += 1

    def tick(self) -> None:
        self.ticks += 1

    def progressed(self, req: Request) -> None:
        """`req` got work this step: its age counts from now (a batch request ages while it waits,
        not while it advances in short batch steps), and so does every batch request's (they
        wait behind it in arrival order, not behind online work)."""
        req.arrival_step = self._batch_progress = self.ticks

    def is_online(self, req: Request) -> bool:
        """Online by request or by age."""
        if req.priority is Priority.ONLINE:
            return True
        return self.ticks - max(req.arrival_step, self._batch_progress) >= self.aging_steps

    def key(self, req: Request) -> tuple[int, int]:
        return (0 if self.is_online(req) else 1), req.arrival_seq


def moving_average(previous: float | None, value: float, weight: float = 0.2) -> float:
    """Exponential moving average; the first value stands alone."""
    return value if previous is None else (1 - weight) * previous + weight * value


RESPONSIVE_WINDOW_S = 10.0  # online requests this recent keep batch steps (and lane units) short
# While online requests come, a step of batch work alone is sized to about this share of the time
# an online step took: an online request arriving meanwhile waits at most that long for it.
RESPONSIVE_SHARE = 0.5
MIN_RESPONSIVE_TOKENS = 4
# Batch tokens in a step with online work: about this share of an online step's time, so they
# lengthen it by about that much (on a CPU a step's time grows with its tokens: 16 batch tokens
# beside a 15-token query doubled its step; on a GPU, where small steps cost the same, more ride).
RIDE_SHARE = 0.1
# An online step's time is the median of the last this many: one long online step (a warm-up's,
# a document's) does not size the batch steps after it for long.
ONLINE_STEPS_SEEN = 9
# With no online work lately, a step of batch work alone still takes about this long at most (at
# the rate steps ran at): the first online request after a lull waits that long, not a whole
# budget's step (2,048 tokens of a 135M decoder on two cores: 2.6 s); bigger steps ran no faster.
LULL_STEP_S = 0.25


class BatchAllowance:
    """How many tokens of a step batch work may take (the scheduler's rule, measured here):

    - no online work waits and none came in the last RESPONSIVE_WINDOW_S: the whole budget,
      or less where steps ran slower than a budget per LULL_STEP_S;
    - online work waits: about RIDE_SHARE of an online step's time, in tokens at the rate steps
      ran at lately (possibly none; at most `cap`: batch_tokens_with_online; `cap` itself until
      steps were timed), so an online request's own step stays short;
    - online work came lately: about RESPONSIVE_SHARE of an online step's time (at least
      MIN_RESPONSIVE_TOKENS), so the step an online request arrives during is short too.

    A step that would otherwise hold nothing still runs the first batch request (whole, for a
    model that cannot cut a prompt into chunks): batch work never stops while online is idle."""

    def __init__(self, budget: int, cap: int) -> None:
        self.budget = budget
        self.cap = cap
        self.last_online_s: float | None = None  # when online work last waited at a step
        self._online_steps: deque[float] = deque(maxlen=ONLINE_STEPS_SEEN)
        self.tokens_per_s: float | None = None  # the rate steps ran at, moving average

    @property
    def online_step_s(self) -> float | None:
        """How long steps with online work took lately (median), None before the first."""
        return statistics.median(self._online_steps) if self._online_steps else None

    def observe(self, online: bool, tokens: int, seconds: float) -> None:
        if online:
            self.last_online_s = time.monotonic()
            self._online_steps.append(seconds)
        if tokens and seconds > 0:
            self.tokens_per_s = moving_average(self.tokens_per_s, tokens / seconds)

    def recent(self) -> bool:
        last = self.last_online_s
        return last is not None and time.monotonic() - last <= RESPONSIVE_WINDOW_S

    def tokens(self, online_queued: bool) -> int:
        if not online_queued and not self.recent():
            if self.tokens_per_s is None:
                return self.budget
            return max(MIN_RESPONSIVE_TOKENS, min(self.budget, int(LULL_STEP_S * self.tokens_per_s)))
        online_s = self.online_step_s
        if online_s is None or self.tokens_per_s is None:
            return self.cap
        if online_queued:
            return min(self.cap, int(RIDE_SHARE * online_s * self.tokens_per_s))
        sized = int(RESPONSIVE_SHARE * online_s * self.tokens_per_s)
        return max(MIN_RESPONSIVE_TOKENS, min(self.cap, sized))
