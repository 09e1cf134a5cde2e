"""TensorParallelRunner: the driver's ModelRunner when a model runs on N ranks.

Rank 0 is the driver's own process: the engine thread computes rank 0's shard itself (its
KV heads, its weights) after handing the step to ranks 1..N-1, the spawned worker processes
(parallel/worker.py). The scheduler, block tables and pooling stay in the driver; a step
crosses to the workers as its SchedulerOutput, pickled once and written to each worker's
pipe, and every rank builds the same packed inputs from it. No rows come back: after the
last all-reduce every rank holds the whole hidden state, so rank 0's pooled rows are the
answer.

A step that fails on any rank leaves the ranks out of step with each other, so there is no
"fail this step only" here: the runner raises TensorParallelError (an EngineDeadError) and
the engine loop stops, failing every request in flight with that message. A worker that
dies while the engine is idle is seen by `watch`'s thread, which stops the loop the same way.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import torch

from embedserve.errors import EngineDeadError, ModelLoadError
from embedserve.parallel.group import free_port
from embedserve.parallel.worker import ERROR, LOADED, WorkerSpec, build_rank, rank_device, worker_main
from embedserve.scheduler.output import SchedulerOutput
from embedserve.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 5.0  # a worker asked to stop gets this long before it is killed


class TensorParallelError(EngineDeadError):
    """A rank failed or died: the model can no longer run (the engine stops)."""


@dataclass
class _Worker:
    rank: int
    process: BaseProcess
    conn: Connection

    def settle(self, timeout: float) -> None:
        """Wait up to `timeout` for the exit code of a worker that is exiting. Two threads
        (the engine's, the watcher) may ask at once; the one that loses the race to reap the
        child sees no code yet, so this polls rather than trusting one answer."""
        deadline = time.monotonic() + timeout
        while self.process.exitcode is None and time.monotonic() < deadline:
            self.process.join(0.05)

    def describe(self) -> str:
        code = self.process.exitcode
        if code is None:
            state = "is still running"
        elif code < 0:
            state = f"was killed by signal {-code} ({signal.Signals(-code).name})"
        else:
            state = f"exited with code {code}"
        return f"tensor-parallel worker rank {self.rank} (pid {self.process.pid}) {state}"

    def error_message(self) -> str | None:
        """What the worker said before it exited, if anything."""
        try:
            if self.conn.poll(0):
                kind, text = self.conn.recv()
                return str(text) if kind == ERROR else None
        except (EOFError, OSError):
            pass
        return None


class TensorParallelRunner(ModelRunner):
    def __init__(self, spec: WorkerSpec) -> None:
        """`spec`: rank 0's (its rank and port are ignored). Returns once every rank has
        loaded and joined the group; ModelLoadError naming the rank that could not."""
        world = spec.world
        port = free_port()
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding OpenMP / CUDA state
        self.workers: list[_Worker] = []
        for rank in range(1, world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main,
                args=(_with(spec, rank, port), child),
                name=f"embedserve-tp-rank{rank}",
                daemon=True,  # never outlives the driver
            )
            proc.start()
            child.close()
            self.workers.append(_Worker(rank, proc, parent))
        self._stop_watch = threading.Event()
        # Also run when the runner is dropped (an engine whose build failed later) or at exit;
        # it gives the process back its thread count (rank 0 runs in the driver's process).
        threads = torch.get_num_threads()
        self._finalizer = weakref.finalize(self, _stop, self.workers, self._stop_watch, threads)
        try:
            torch.set_num_threads(spec.threads)
            model, self.group, own_bytes = build_rank(_with(spec, 0, port))
            self.rank_weight_bytes = [own_bytes, *(self._loaded(w) for w in self.workers)]
            self.group.connect(port)
        except BaseException:
            self.close()
            raise
        # rank 0's KV cache holds its kv heads only: each worker keeps its own
        super().__init__(model, spec.num_blocks, spec.block_size, spec.dtype, rank_device(spec.device, 0))
        self.world = world

    @staticmethod
    def _loaded(w: _Worker) -> int:
        """Wait for worker `w` to load; its weight bytes."""
        wait([w.conn, w.process.sentinel])
        try:
            kind, value = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(JOIN_TIMEOUT_S)
            raise ModelLoadError(f"{w.describe()} while loading its shard") from None
        if kind != LOADED:
            raise ModelLoadError(f"tensor-parallel rank {w.rank} could not load its shard: {value}")
        return int(value)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[int, torch.Tensor]:
        payload = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for w in self.workers:
                w.conn.send_bytes(payload)
            return super().execute(out)
        except Exception as e:  # the ranks are out of step now, whatever failed
            raise self._failure(e, out.step) from e

    def _failure(self, error: Exception, step: int) -> TensorParallelError:
        for w in self.workers:  # a killed peer's socket closes before its exit is reaped
            w.settle(0.5)
        dead = [w for w in self.workers if w.process.exitcode is not None]
        if not dead:
            return TensorParallelError(
                f"tensor-parallel step {step} failed on rank 0: {type(error).__name__}: {error}"
            )
        parts = []
        for w in dead:
            said = w.error_message()
            parts.append(w.describe() + (f": {said}" if said else ""))
        return TensorParallelError(f"{'; '.join(parts)} during step {step}")

    def watch(self, on_dead: Callable[[BaseException], None]) -> None:
        """Call `on_dead` (from a thread of its own) when a worker exits unasked."""

        def run() -> None:
            sentinels = {w.process.sentinel: w for w in self.workers}
            while not self._stop_watch.is_set():
                ready = wait(list(sentinels), timeout=0.5)
                if ready and not self._stop_watch.is_set():
                    w = sentinels[ready[0]]  # type: ignore[index]
                    w.settle(1.0)
                    said = w.error_message()
                    on_dead(TensorParallelError(w.describe() + (f": {said}" if said else "")))
                    return

        threading.Thread(target=run, name="embedserve-tp-watch", daemon=True).start()

    def close(self) -> None:
        """Stop every worker (asked, then killed after JOIN_TIMEOUT_S); idempotent."""
        self._finalizer()

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid or 0 for w in self.workers]


def _stop(workers: list[_Worker], stop_watch: threading.Event, threads: int) -> None:
    stop_watch.set()
    torch.set_num_threads(threads)
    for w in workers:
        with contextlib.suppress(OSError):
            w.conn.send_bytes(pickle.dumps(None))
    for w in workers:
        w.process.join(JOIN_TIMEOUT_S)
        if w.process.exitcode is None:
            log.warning("tensor-parallel rank %d did not stop; killing it", w.rank)
            w.process.kill()
            w.process.join()
        w.conn.close()


def _with(spec: WorkerSpec, rank: int, port: int) -> WorkerSpec:
    return replace(spec, rank=rank, port=port)


def threads_per_rank(world: int, device: torch.device) -> int:
    """CPU ranks share the machine's cores: each gets its share (at least one)."""
    if device.type == "cuda":
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // world)
