"""The engine loop: a background thread that owns the EngineCore.

Callers never touch the core. They post requests to an inbox and wait on futures
(`concurrent.futures.Future`, which asyncio can await). Futures stay pending (never
"running") so a caller can cancel one; a cancelled future aborts its request at the next
step, freeing its KV blocks.

The loop's thread also builds the engine (`EngineLoop(build)`, `start_thread`), so that one thread runs every
parallel CPU op of the model, from loading and the kernels' self-checks to serving. Each
thread that starts OpenMP work keeps a pool of OpenMP threads; with a second pool alive (the
loading thread's) GNU OpenMP manages more threads than there are cores and stops spinning
between parallel regions: the idle thread sleeps and waits to be woken at every op, and the
compute threads stand idle part of each unit (docs/performance.md, 'One OpenMP pool').
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TypeVar

from embedserve.engine.builder import EngineParts
from embedserve.engine.core import EngineCore, Finished
from embedserve.errors import EngineDeadError
from embedserve.request import Request
from embedserve.worker.host_memory import release_free_heap

log = logging.getLogger(__name__)

IDLE_RELEASE_S = 1.0  # seconds without work before the loop releases free heap pages

T = TypeVar("T")


def start_thread(name: str, setup: Callable[[], T], run: Callable[[T], None]) -> tuple[threading.Thread, T]:
    """Start a daemon thread that runs `setup()` and then `run` on what it returned, so one
    thread both loads a model and runs it (see above). Returns the thread and `setup()`'s
    value once setup is done, or raises what `setup()` raised (the thread then ends)."""
    ready: Future[T] = Future()

    def main() -> None:
        try:
            made = setup()
        except BaseException as e:  # raised by start_thread's caller
            ready.set_exception(e)
            return
        ready.set_result(made)
        run(made)

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    return thread, ready.result()


class EngineLoop:
    def __init__(self, build: Callable[[], EngineParts]) -> None:
        """Start the loop's thread and build the engine's parts there with `build()`; returns
        once they are built, raising what `build()` raised."""
        # one item per `submit`: a call's requests reach the core together (one step sees them all)
        self._inbox: queue.SimpleQueue[list[tuple[Request, Future[Finished]]] | None] = queue.SimpleQueue()
        self._futures: dict[int, Future[Finished]] = {}
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stopping = False
        self._thread, self.parts = start_thread("embedserve-engine", build, self._run)
        self.core: EngineCore = self.parts.core
        self._stats: dict[str, int] = self.core.stats()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, requests: list[Request]) -> list[Future[Finished]]:
        if not self.alive:
            raise EngineDeadError(f"the engine loop is not running ({self._error or 'stopped'})")
        posted: list[tuple[Request, Future[Finished]]] = [(req, Future()) for req in requests]
        self._inbox.put(posted)
        return [fut for _, fut in posted]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def fail(self, error: BaseException) -> None:
        """Stop the loop from another thread because the engine cannot run any more (a
        tensor-parallel worker died): requests in flight and queued fail naming `error`."""
        if self._error is None:
            self._error = error
        self._inbox.put(None)

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout)

    # ---- engine thread ---------------------------------------------------------------------

    def _drain(self, block: bool) -> bool:
        """Move posted requests into the core; False once a stop was posted. Blocking, the
        first `IDLE_RELEASE_S` without a request give the C heap's free pages back."""
        try:
            item = self._inbox.get(block=block, timeout=IDLE_RELEASE_S if block else None)
        except queue.Empty:
            if not block:
                return True
            release_free_heap()  # idle: what the last work freed goes back to the OS
            item = self._inbox.get()
        while True:
            if item is None:
                return False
            for req, fut in item:
                if fut.cancelled():
                    continue
                try:
                    self.core.add(req)
                    self._futures[req.request_id] = fut
                except Exception as e:  # admission refused: tell that caller only
                    _settle(fut, error=e)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _reap_cancelled(self) -> None:
        for rid in [rid for rid, f in self._futures.items() if f.cancelled()]:
            self.core.abort(rid)
            del self._futures[rid]

    def _publish(self, finished: list[Finished]) -> None:
        with self._lock:  # before waking callers: they may read stats right away
            self._stats = self.core.stats()
        for fin in finished:
            fut = self._futures.pop(fin.request.request_id, None)
            if fut is not None:
                _settle(fut, result=fin, error=fin.error)

    def _run(self, parts: EngineParts) -> None:
        self.core = parts.core  # the constructor may not have set it yet
        if parts.workers is not None:
            parts.workers.watch(self.fail)
        try:
            while self._drain(block=not self.core.has_work):
                self._reap_cancelled()
                self._publish(self.core.step(self._publish))
        except BaseException as e:  # the loop itself broke: fail everyone, loudly
            log.exception("engine loop died")
            self._error = e
        finally:
            self._stopping = True
            if parts.workers is not None:
                parts.workers.close()
            err = EngineDeadError(f"engine stopped: {self._error or 'shut down'}")
            for fut in self._futures.values():
                _settle(fut, error=err)
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                for _, fut in item or ():
                    _settle(fut, error=err)


def _settle(
    fut: Future[Finished], result: Finished | None = None, error: BaseException | None = None
) -> None:
    """Complete a future unless its caller cancelled it meanwhile."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass  # cancelled by the caller: nobody is waiting


def wait_all(futures: list[Future[Finished]]) -> list[Finished]:
    """Every request's result, in order; when one fails (or the caller is interrupted) the
    others are cancelled, so their KV blocks are freed, and the error is raised."""
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise


async def gather_all(futures: list[Future[Finished]]) -> list[Finished]:
    """`wait_all`, awaited (a cancelled caller cancels the requests too)."""
    try:
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
    except BaseException:
        for f in futures:
            f.cancel()
        raise
