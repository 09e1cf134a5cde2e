"""EngineCore: one synchronous step = schedule -> execute -> update. Single-threaded.

Long prompts (at least `layer_major_tokens`) bypass the scheduler and the KV cache: they run
layer-major in `LayerMajorLane`, which gets a slice of every step after the scheduler's batch,
counted in token-layers (one token through one layer):

- online work waited and the lane's next prompt is batch work: nothing. The lane goes on
  next step; each step it is passed over ages its prompts toward the online class.
- online work waited, or came in the last `RESPONSIVE_WINDOW_S`: one unit cut to about the
  time an online step took (`online_step_s`). Online requests the step finished are answered
  before it runs, and one arriving meanwhile waits for at most that unit.
- the scheduler had nothing: one (layer, chunk) unit.
- otherwise: the step's token budget, counted per layer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from embedserve.engine.layer_major_lane import LayerMajorLane, moving_average
from embedserve.errors import InternalEngineError, InvalidInputError
from embedserve.pooling.head import apply_head
from embedserve.request import Request
from embedserve.scheduler.scheduler import Scheduler
from embedserve.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)

RESPONSIVE_WINDOW_S = 10.0  # online requests this recent keep the lane's units short


@dataclass(frozen=True)
class Finished:
    request: Request
    vector: torch.Tensor | None  # float32 [dim]; None when `error` is set
    error: Exception | None = None
    finish_time: float = 0.0


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, lane: LayerMajorLane | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.lane = lane
        self.requests: dict[int, Request] = {}
        self.num_steps = 0
        self.tokens_computed = 0
        self.last_online_s: float | None = None  # when online work last waited at a step
        self.online_step_s: float | None = None  # how long such steps took, moving average

    def _in_lane(self, num_tokens: int) -> bool:
        return self.lane is not None and self.lane.accepts(num_tokens)

    def check_admissible(self, num_tokens: int) -> None:
        """Raise if a prompt of this length could never run."""
        if not self._in_lane(num_tokens):
            self.scheduler.check_admissible(num_tokens)
        elif num_tokens > self.scheduler.config.max_model_len:  # no KV limit in the lane
            raise InvalidInputError(
                f"{num_tokens} tokens exceed max_model_len ({self.scheduler.config.max_model_len})"
            )

    def add(self, req: Request) -> None:
        if self.lane is not None and self._in_lane(req.num_prompt_tokens):
            self.check_admissible(req.num_prompt_tokens)
            self.lane.add(req)
        else:
            self.scheduler.add_request(req)
        self.requests[req.request_id] = req

    def abort(self, request_id: int) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and not (self.lane is not None and self.lane.drop(request_id)):
            self.scheduler.abort(req)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or (self.lane is not None and self.lane.has_work)

    def step(self, publish: Callable[[list[Finished]], None] | None = None) -> list[Finished]:
        """One step: the scheduler's batch, then the lane's slice. With `publish`, requests the
        scheduler's part finished are handed to it before the lane's slice runs (the loop
        answers them then); the rest are returned."""
        steps = self.num_steps
        online = self.scheduler.has_online_work()
        alone = not self.scheduler.has_work
        start = time.monotonic()
        done = self._scheduler_step()
        if online:
            self.last_online_s = end = time.monotonic()
            self.online_step_s = moving_average(self.online_step_s, end - start)
        if publish is not None and done:
            publish(done)
            done = []
        if self.lane is not None and self.lane.has_work:
            if online and not self.lane.next_is_online():
                self.lane.skip()  # online requests first; the lane goes on in the next step
            else:
                done += self._lane_step(self.lane, self._lane_slice(self.lane, online, alone))
            self.num_steps = steps + 1  # one step, whichever part ran
        return done

    def _lane_slice(self, lane: LayerMajorLane, online: bool, alone: bool) -> int:
        """Token-layers for the lane this step (see the module docstring)."""
        last = self.last_online_s
        recent = last is not None and time.monotonic() - last <= RESPONSIVE_WINDOW_S
        if (online or recent) and self.online_step_s is not None:  # set whenever `online`
            return lane.rows_within(self.online_step_s)  # one unit, about an online step long
        if alone:
            return lane.chunk  # one (layer, chunk) unit
        return self.scheduler.config.max_num_batched_tokens * lane.num_layers

    def _lane_step(self, lane: LayerMajorLane, token_layers: int) -> list[Finished]:
        req = lane.peek()
        assert req is not None
        if req.first_scheduled_time is None:
            req.first_scheduled_time = time.monotonic()
        try:
            finished = lane.step(token_layers)
        except Exception as e:  # fails this prompt only
            log.exception("layer-major forward failed for request %d", req.request_id)
            lane.drop(req.request_id)
            self.requests.pop(req.request_id, None)
            return [Finished(req, None, _forward_error(e), time.monotonic())]
        if not finished:
            return []
        self.requests.pop(req.request_id, None)
        self.tokens_computed += req.num_prompt_tokens
        return [self._finish(req, time.monotonic())]

    def _scheduler_step(self) -> list[Finished]:
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
            done.append(self._finish(req, end))
        return done

    @staticmethod
    def _finish(req: Request, end: float) -> Finished:
        try:
            pooled = req.pooling.finish()
        except InternalEngineError as e:
            return Finished(req, None, e, end)
        vector = apply_head(pooled, req.params.dimensions, req.params.normalize)
        return Finished(req, vector, None, end)

    def _fail(self, request_id: int, error: Exception) -> Finished:
        req = self.requests.pop(request_id)
        self.scheduler.fail(req)
        return Finished(req, None, _forward_error(error), time.monotonic())

    def stats(self) -> dict[str, int]:
        kv = self.scheduler.kv
        lane = self.lane.stats() if self.lane is not None else {}
        return lane | {
            "steps": self.num_steps,
            "preemptions": self.scheduler.num_preemptions,
            "kv_blocks_used": kv.pool.num_used,
            "kv_blocks_total": kv.num_blocks,
            "tokens_computed": self.tokens_computed,
            # both paths: started layer-major inputs count as running
            "num_running": len(self.scheduler.running) + lane.get("layer_major_started", 0),
            "num_waiting": len(self.scheduler.waiting) + lane.get("layer_major_waiting", 0),
        }


def _forward_error(error: Exception) -> InternalEngineError:
    if isinstance(error, InternalEngineError):
        return error
    return InternalEngineError(f"forward pass failed: {type(error).__name__}: {error}")
