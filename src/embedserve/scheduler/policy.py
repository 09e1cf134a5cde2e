"""The one priority policy both queues use (the scheduler's and the layer-major lane's).

Requests order by key = (class, arrival): `online` before `batch`, then first come, first
served. A batch request counts as online once its queue's clock ticked `aging_steps` times
since it arrived, so a stream of online work cannot starve it. Each queue keeps its own clock
(the scheduler ticks once per step; the lane once per step in which online work went before
its prompts) but the stamp, the aging rule and the key are these.
"""

from __future__ import annotations

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

    def is_online(self, req: Request) -> bool:
        """Online by request or by age."""
        return req.priority is Priority.ONLINE or self.ticks - req.arrival_step >= self.aging_steps

    def key(self, req: Request) -> tuple[int, int]:
        return (0 if self.is_online(req) else 1), req.arrival_seq


def moving_average(previous: float | None, value: float, weight: float = 0.2) -> float:
    """Exponential moving average; the first value stands alone."""
    return value if previous is None else (1 - weight) * previous + weight * value
