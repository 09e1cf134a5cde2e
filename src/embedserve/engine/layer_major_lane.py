"""The lane for long prompts: layer-major prefill, outside the KV cache.

Prompts of at least `min_tokens` tokens never take KV blocks. They queue here by the
scheduler's key (online before batch, a batch prompt aging into online once online work went
before it in `aging_steps` steps, then arrival) and the engine gives the lane a slice of work
each step, counted in token-layers (one token through one layer), so a step that also runs the
scheduler's batch stays bounded. A more urgent prompt may start while another is part-way:
the paused one keeps its buffers (hidden states and one layer's K/V) and resumes after.

A request that arrives while a unit runs waits for it. `rows_within(seconds)` sizes the
next unit to a time, from the FLOPs each unit cost and the FLOP/s units achieved so far,
so the engine can keep units as short as an online query's own step while queries come.
"""

from __future__ import annotations

import time

import torch

from embedserve.models.decoder import DecoderModel
from embedserve.request import Priority, Request
from embedserve.worker.host_memory import release_free_heap
from embedserve.worker.layer_major import LayerMajorJob


def moving_average(previous: float | None, value: float, weight: float = 0.2) -> float:
    """Exponential moving average; the first value stands alone."""
    return value if previous is None else (1 - weight) * previous + weight * value


class LayerMajorLane:
    def __init__(
        self, model: DecoderModel, min_tokens: int, chunk: int, device: torch.device, aging_steps: int
    ) -> None:
        if min_tokens < 1:
            raise ValueError("layer_major_tokens must be >= 1")
        self.model = model
        self.min_tokens = min_tokens
        self.chunk = chunk
        self.device = device
        self.aging_steps = aging_steps
        self.num_layers = model.config.num_hidden_layers
        self.waiting: list[Request] = []
        self.started: dict[int, LayerMajorJob] = {}
        self.step_count = 0
        self.num_finished = 0
        self._next_seq = 0
        self.flops_per_s: float | None = None  # achieved by lane units, moving average

    def accepts(self, num_tokens: int) -> bool:
        return num_tokens >= self.min_tokens

    def add(self, req: Request) -> None:
        req.arrival_seq, req.arrival_step = self._next_seq, self.step_count
        self._next_seq += 1
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

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.started)

    def _key(self, req: Request) -> tuple[int, int]:
        aged = self.step_count - req.arrival_step >= self.aging_steps
        return (0 if req.priority is Priority.ONLINE or aged else 1), req.arrival_seq

    def peek(self) -> Request | None:
        """The most urgent prompt, started or waiting."""
        candidates = self.waiting + [job.request for job in self.started.values()]
        return min(candidates, key=self._key) if candidates else None

    def next_job(self) -> LayerMajorJob | None:
        """The most urgent prompt's job, started if it was waiting."""
        req = self.peek()
        if req is None:
            return None
        job = self.started.get(req.request_id)
        if job is None:
            self.waiting.remove(req)
            job = self.started[req.request_id] = LayerMajorJob(self.model, req, self.chunk, self.device)
        return job

    def next_is_online(self) -> bool:
        req = self.peek()
        return req is not None and self._key(req)[0] == 0

    def skip(self) -> None:
        """A step ran online work outside the lane instead of it: batch prompts age."""
        self.step_count += 1

    def rows_within(self, seconds: float) -> int:
        """Rows for the next unit of the most urgent prompt to take about `seconds` (at least
        one row; a full chunk until a unit has been timed)."""
        job = self.next_job()
        if job is None or self.flops_per_s is None:
            return self.chunk
        return job.rows_within(seconds * self.flops_per_s)

    def step(self, token_layers: int) -> bool:
        """Give the most urgent prompt (`peek()`) `token_layers` of work; True when it is done.

        A finished request's pooling state holds its vector; the lane forgets it. An exception
        leaves the request started: the caller fails it and calls `drop`.
        """
        job = self.next_job()
        if job is None:
            return False
        if self._key(job.request)[0] == 0:  # online work ran before any batch prompt here
            self.step_count += 1
        flops, start = job.flops_done, time.perf_counter()
        job.run(token_layers)
        elapsed = time.perf_counter() - start
        if elapsed > 0 and job.flops_done > flops:
            self.flops_per_s = moving_average(self.flops_per_s, (job.flops_done - flops) / elapsed)
        if not job.done:
            return False
        job.pool()
        del self.started[job.request.request_id]
        self.num_finished += 1
        release_free_heap()  # its buffers and activations, now free, back to the OS
        return True

    def stats(self) -> dict[str, int]:
        return {
            "layer_major_waiting": len(self.waiting),
            "layer_major_started": len(self.started),
            "layer_major_finished": self.num_finished,
        }
