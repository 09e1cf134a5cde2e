"""Runs the layer-major lane's slices (scheduler/lane.py decides them): one LayerMajorJob per
started prompt, its buffers kept while a more urgent prompt runs.

A unit sized to a time (`LaneSlice.timed`) comes from the FLOPs each unit cost and the FLOP/s
units achieved so far, so the engine can keep units as short as an online query's own step
while queries come.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from embedserve.lora.rows import running, uniform
from embedserve.models.decoder import DecoderModel
from embedserve.request import Request
from embedserve.scheduler.policy import moving_average
from embedserve.worker.host_memory import release_free_heap
from embedserve.worker.layer_major import LayerMajorJob


class LaneRunner:
    def __init__(
        self, model: DecoderModel, chunk: int, device: torch.device, deterministic_chunk: int | None = None
    ) -> None:
        """`deterministic_chunk`: deterministic mode's attention piece: whole-chunk units, attention per piece
        (see LayerMajorJob); `chunk` is then rounded down to a multiple of it."""
        self.model = model
        dc = deterministic_chunk
        self.chunk = chunk if dc is None else max(dc, chunk - chunk % dc)
        self.device = device
        self.deterministic_chunk = deterministic_chunk
        self.jobs: dict[int, LayerMajorJob] = {}
        self.flops_per_s: float | None = None  # achieved by lane units, moving average

    def job(self, req: Request) -> LayerMajorJob:
        """The prompt's job, created (no buffers yet) on its first slice."""
        job = self.jobs.get(req.request_id)
        if job is None:
            dc = self.deterministic_chunk
            job = self.jobs[req.request_id] = LayerMajorJob(
                self.model, req, self.chunk, self.device, dc is not None, dc
            )
        return job

    def rows_within(self, req: Request, seconds: float) -> int:
        """Rows for the prompt's next unit to take about `seconds` (at least one row; a full
        chunk until a unit has been timed)."""
        if self.flops_per_s is None:
            return self.chunk
        return self.job(req).rows_within(seconds * self.flops_per_s)

    def run(self, req: Request, token_layers: int) -> bool:
        """Give the prompt `token_layers` of work; True when its last layer ran (then read
        `pooled_rows`). An exception leaves the job: the caller fails the request and drops it."""
        job = self.job(req)
        flops, start = job.flops_done, time.perf_counter()
        with running(uniform(req.adapter)):  # its LoRA adapter's rows: all of them
            job.run(token_layers)
        elapsed = time.perf_counter() - start
        if elapsed > 0 and job.flops_done > flops:
            self.flops_per_s = moving_average(self.flops_per_s, (job.flops_done - flops) / elapsed)
        return job.done

    def pooled_rows(self, request_id: int) -> Iterator[tuple[int, int, torch.Tensor]]:
        """A finished prompt's (start, n, rows) per chunk; the runner forgets it, and its
        buffers go back to the OS once read."""
        job = self.jobs.pop(request_id)
        yield from job.pooled_rows()
        del job
        release_free_heap()  # its buffers and activations, now free

    def drop(self, request_id: int) -> None:
        self.jobs.pop(request_id, None)
