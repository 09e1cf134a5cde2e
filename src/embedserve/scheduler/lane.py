"""The layer-major lane's queue and how much of a step it gets (policy only, no tensors).

Prompts of at least `min_tokens` tokens never take KV blocks: the worker runs them
layer-major (worker/lane_runner.py). They queue here by the shared priority key
(scheduler/policy.py); a more urgent prompt may start while another is part-way (the paused
one keeps its buffers and resumes after). Each step the scheduler gives the lane a slice
after its batch, counted in token-layers (one token through one layer):

- online work waits and the lane's next prompt is batch work: nothing. The clock ticks, so
  passed-over prompts age toward the online class.
- online work waits, or came in the last `RESPONSIVE_WINDOW_S` (scheduler/policy.py): one
  unit cut to about the time an online step took. Online requests the step finished are
  answered before it runs, and one arriving meanwhile waits for at most that unit.
- the scheduler had nothing: one (layer, chunk) unit.
- otherwise: the step's token budget, counted per layer.
"""

from __future__ import annotations

from embedserve.request import Request, RequestStatus
from embedserve.scheduler.output import LaneSlice
from embedserve.scheduler.policy import PriorityClock


class LaneQueue:
    def __init__(self, min_tokens: int, chunk: int, num_layers: int, aging_steps: int) -> None:
        if min_tokens < 1:
            raise ValueError("layer_major_tokens must be >= 1")
        self.min_tokens = min_tokens
        self.chunk = chunk  # tokens per (layer, chunk) unit: the step's token budget
        self.num_layers = num_layers
        self.clock = PriorityClock(aging_steps)
        self.waiting: list[Request] = []
        self.started: dict[int, Request] = {}  # part-way: the worker holds their buffers
        self.num_finished = 0

    def accepts(self, num_tokens: int) -> bool:
        return num_tokens >= self.min_tokens

    def add(self, req: Request) -> None:
        self.clock.stamp(req)
        self.waiting.append(req)

    def drop(self, request_id: int) -> bool:
        """Forget a request (aborted or failed); True if it was here."""
        if self.started.pop(request_id, None) is not None:
            return True
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                return True
        return False

    def finish(self, req: Request) -> None:
        del self.started[req.request_id]
        req.status = RequestStatus.FINISHED
        self.num_finished += 1

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.started)

    def peek(self) -> Request | None:
        """The most urgent prompt, started or waiting."""
        candidates = self.waiting + list(self.started.values())
        return min(candidates, key=self.clock.key) if candidates else None

    def next_is_online(self) -> bool:
        req = self.peek()
        return req is not None and self.clock.is_online(req)

    def slice(self, online: bool, recent: bool, alone: bool, budget: int) -> LaneSlice | None:
        """This step's slice (see the module docstring): `online` work waited at this step,
        some came `recent`ly, the scheduler had nothing (`alone`), its token `budget`."""
        req = self.peek()
        if req is None:
            return None
        if online and not self.clock.is_online(req):
            self.clock.tick()  # online requests first; the lane goes on in the next step
            return None
        if self.clock.is_online(req):
            self.clock.tick()  # online work runs before any batch prompt here
        if req.request_id not in self.started:
            self.waiting.remove(req)
            self.started[req.request_id] = req
            req.status = RequestStatus.RUNNING
        if online or recent:  # one unit about an online step long
            return LaneSlice(req.request_id, self.chunk, timed=True)
        return LaneSlice(req.request_id, self.chunk if alone else budget * self.num_layers)

    def stats(self) -> dict[str, int]:
        return {
            "layer_major_waiting": len(self.waiting),
            "layer_major_started": len(self.started),
            "layer_major_finished": self.num_finished,
        }
