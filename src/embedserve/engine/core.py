"""EngineCore: one synchronous step = schedule -> execute -> update. Single-threaded."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from embedserve.errors import InternalEngineError
from embedserve.pooling.head import apply_head
from embedserve.request import Request
from embedserve.scheduler.scheduler import Scheduler
from embedserve.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    request: Request
    vector: torch.Tensor | None  # float32 [dim]; None when `error` is set
    error: Exception | None = None
    finish_time: float = 0.0


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.requests: dict[int, Request] = {}
        self.num_steps = 0
        self.tokens_computed = 0

    def add(self, req: Request) -> None:
        self.scheduler.add_request(req)
        self.requests[req.request_id] = req

    def abort(self, request_id: int) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.abort(req)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[Finished]:
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        now = time.monotonic()
        for c in out.chunks:
            req = self.requests[c.request_id]
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        try:
            rows = self.runner.execute(out)
        except Exception as e:  # a failed forward fails this step's requests, not the engine
            log.exception("forward pass failed at step %d", out.step)
            return [self._fail(c.request_id, e) for c in out.chunks]
        self.num_steps += 1
        self.tokens_computed += out.num_tokens
        done: list[Finished] = []
        try:
            finished = self.scheduler.update_from_output(out, rows, self.requests)
        except InternalEngineError as e:
            log.exception("pooling invariant broke at step %d", out.step)
            return [self._fail(c.request_id, e) for c in out.chunks]
        end = time.monotonic()
        for req in finished:
            self.requests.pop(req.request_id, None)
            try:
                pooled = req.pooling.finish()
            except InternalEngineError as e:
                done.append(Finished(req, None, e, end))
                continue
            vector = apply_head(pooled, req.params.dimensions, req.params.normalize)
            done.append(Finished(req, vector, None, end))
        return done

    def _fail(self, request_id: int, error: Exception) -> Finished:
        req = self.requests.pop(request_id)
        self.scheduler.fail(req)
        wrapped = (
            error
            if isinstance(error, InternalEngineError)
            else InternalEngineError(f"forward pass failed: {type(error).__name__}: {error}")
        )
        return Finished(req, None, wrapped, time.monotonic())

    def stats(self) -> dict[str, int]:
        kv = self.scheduler.kv
        return {
            "steps": self.num_steps,
            "preemptions": self.scheduler.num_preemptions,
            "kv_blocks_used": kv.pool.num_used,
            "kv_blocks_total": kv.num_blocks,
            "tokens_computed": self.tokens_computed,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
        }
