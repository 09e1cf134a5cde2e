"""EngineCore: one synchronous step = schedule -> run the chunks -> fold -> answer -> run the
layer-major lane's slice. Single-threaded.

The scheduler decides everything about a step (its chunks and the lane's slice, see
scheduler/lane.py); the core runs them, folds every pooled row into its request's
PoolingState in one place (`_fold`), and turns finished states into vectors.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from embedserve.engine.isolate import isolate
from embedserve.errors import EngineDeadError, InternalEngineError
from embedserve.pooling.head import apply_head
from embedserve.request import Request, RequestStatus
from embedserve.scheduler.output import LaneSlice, SchedulerOutput
from embedserve.scheduler.scheduler import Scheduler
from embedserve.worker.lane_runner import LaneRunner
from embedserve.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    request: Request
    vector: torch.Tensor | None  # float32 [dim]; None when `error` is set
    error: Exception | None = None
    finish_time: float = 0.0


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, lane: LaneRunner | None = None) -> None:
        if (lane is None) != (scheduler.lane is None):
            raise ValueError("a layer-major lane needs both its queue (scheduler) and its runner")
        self.scheduler = scheduler
        self.runner = runner
        self.lane = lane
        self.requests: dict[int, Request] = {}
        self.num_steps = 0
        self.tokens_computed = 0

    def check_admissible(self, num_tokens: int) -> None:
        """Raise if a prompt of this length could never run."""
        self.scheduler.check_admissible(num_tokens)

    def add(self, req: Request) -> None:
        self.scheduler.add_request(req)
        self.requests[req.request_id] = req

    def abort(self, request_id: int) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.abort(req)
            if self.lane is not None:
                self.lane.drop(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self, publish: Callable[[list[Finished]], None] | None = None) -> list[Finished]:
        """One step: the scheduler's chunks, then the lane's slice. With `publish`, requests
        the chunks finished are handed to it before the lane's slice runs (the loop answers
        them then); the rest are returned."""
        start = time.monotonic()
        out = self.scheduler.schedule()
        done = self._run_chunks(out) if out.chunks else []
        self.scheduler.observe(out, time.monotonic() - start)
        if not out.is_empty or out.online:
            self.num_steps += 1
        if publish is not None and done:
            publish(done)
            done = []
        if out.lane is not None:
            done += self._run_lane(out.lane)
        return done

    def _run_chunks(self, out: SchedulerOutput) -> list[Finished]:
        now = time.monotonic()
        for c in out.chunks:
            req = self.requests[c.request_id]
            req.num_steps += 1
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        failed: list[Finished] = []
        try:
            rows = self.runner.execute(out)
        except EngineDeadError:  # the runner cannot run another step (a tensor-parallel rank died)
            raise  # the loop stops and fails every request in flight
        except Exception as e:  # a failed forward fails the requests that make it fail, not the engine
            log.exception("forward pass failed at step %d (%d chunks)", out.step, len(out.chunks))
            _release_device_memory(e)
            found = isolate(self.runner.execute, out, e)
            if found.reruns:
                log.warning("step %d re-run by halves (%d passes): %d of %d requests fail",
                            out.step, found.reruns, len(found.failed), len(out.chunks))  # fmt: skip
            rows = found.rows
            failed = [self._fail(rid, err) for rid, err in found.failed.items()]
            out = dataclasses.replace(out, chunks=[c for c in out.chunks if c.request_id in rows])
        self.tokens_computed += out.num_tokens
        try:
            parts = [
                (self.requests.get(c.request_id), c.start, c.num_tokens, rows[c.request_id])
                for c in out.chunks
            ]
            self._fold(parts)
            finished = self.scheduler.update_from_output(out, self.requests)
        except InternalEngineError as e:
            log.exception("pooling invariant broke at step %d", out.step)
            return failed + [self._fail(c.request_id, e) for c in out.chunks if c.request_id in self.requests]
        end = time.monotonic()
        for req in finished:
            self.requests.pop(req.request_id, None)
        return failed + [self._finish(req, end) for req in finished]

    def _run_lane(self, part: LaneSlice) -> list[Finished]:
        assert self.lane is not None
        req = self.requests[part.request_id]
        req.num_lane_slices += 1
        if req.first_scheduled_time is None:
            req.first_scheduled_time = time.monotonic()
        try:
            token_layers = part.token_layers
            online_step_s = self.scheduler.allowance.online_step_s
            if part.timed and online_step_s is not None:
                token_layers = self.lane.rows_within(req, online_step_s)
            if not self.lane.run(req, token_layers):
                return []
            self._fold((req, start, n, rows) for start, n, rows in self.lane.pooled_rows(req.request_id))
        except Exception as e:  # fails this prompt only
            log.exception("layer-major forward failed for request %d", req.request_id)
            return [self._fail(req.request_id, e)]
        self.scheduler.finish_lane(req)
        self.requests.pop(req.request_id, None)
        self.tokens_computed += req.num_prompt_tokens
        return [self._finish(req, time.monotonic())]

    @staticmethod
    def _fold(parts: Iterable[tuple[Request | None, int, int, torch.Tensor]]) -> None:
        """The one place pooled rows meet pooling state: (request, chunk start, chunk tokens,
        its pooled rows) for both paths. A request aborted while its step ran is skipped."""
        for req, start, n, rows in parts:
            if req is not None and req.status is RequestStatus.RUNNING:
                req.pooling.update(start, n, rows)

    @staticmethod
    def _finish(req: Request, end: float) -> Finished:
        try:
            pooled = req.pooling.finish()
        except InternalEngineError as e:
            return Finished(req, None, e, end)
        if req.params.dense is not None:
            pooled = req.params.dense(pooled)
        vector = apply_head(pooled, req.params.dimensions, req.params.normalize)
        return Finished(req, vector, None, end)

    def _fail(self, request_id: int, error: Exception) -> Finished:
        req = self.requests.pop(request_id)
        self.scheduler.fail(req)
        if self.lane is not None:
            self.lane.drop(request_id)
        return Finished(req, None, _forward_error(error), time.monotonic())

    def stats(self) -> dict[str, int]:
        kv = self.scheduler.kv
        lane = self.scheduler.lane.stats() if self.scheduler.lane is not None else {}
        return lane | {
            "steps": self.num_steps,
            "preemptions": self.scheduler.num_preemptions,
            "kv_blocks_used": kv.pool.num_used - len(kv.pinned),  # by requests (not pinned prompts)
            "kv_blocks_total": kv.num_blocks,
            "tokens_computed": self.tokens_computed,
            "prefix_hit_tokens": kv.hit_tokens,
            "prefix_query_tokens": kv.query_tokens,
            "prefix_cached_blocks": kv.pool.num_cached,
            "prefix_pinned_blocks": len(kv.pinned),
            # both paths: started layer-major inputs count as running
            "num_running": len(self.scheduler.running) + lane.get("layer_major_started", 0),
            "num_waiting": len(self.scheduler.waiting) + lane.get("layer_major_waiting", 0),
        }


def _release_device_memory(error: Exception) -> None:
    """After an out-of-memory error, give the allocator's cached blocks back before the next step."""
    if isinstance(error, torch.OutOfMemoryError) and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _forward_error(error: Exception) -> InternalEngineError:
    if isinstance(error, InternalEngineError):
        return error
    return InternalEngineError(f"forward pass failed: {type(error).__name__}: {error}")
