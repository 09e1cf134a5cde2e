"""The baselines a user would otherwise run, behind the simplest server: a FIFO batcher.

One worker thread takes every request waiting (up to `batch_size`) in arrival order and encodes
them as one padded batch. That is what wrapping `SentenceTransformer.encode` in a web handler
with micro-batching gives: no token budget, no chunking, no priorities. A short query that
arrives behind a batch of 16K-token documents waits for the whole batch.

The worker thread also loads the model, as the engine loop does (engine/loop.py's `start_thread`): a model
loaded on one thread and run on another leaves two OpenMP pools, and GNU OpenMP then stops
spinning between parallel regions, which would slow the baseline by a bench artifact.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from embedserve.bench.target import BenchInput, Reply, TargetSpec
from embedserve.engine.loop import start_thread
from embedserve.errors import InvalidInputError

Encode = Callable[[list[str]], np.ndarray]


@dataclass
class _Item:
    text: str
    future: Future[Reply]
    submitted: float


class FifoBatcher:
    def __init__(self, load: Callable[[], Encode], batch_size: int, device: str) -> None:
        """`load()` runs on the worker thread and returns its encode function; raises what
        `load()` raised."""
        self.device = device
        self._batch_size = batch_size
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._thread, _ = start_thread("fifo-batcher", load, self._run)

    async def embed(self, text: BenchInput, priority: str) -> Reply:
        if not isinstance(text, str):
            raise InvalidInputError("the library baselines take text only (no --images-per-input)")
        # FIFO on purpose: the baseline has no notion of priority.
        fut: Future[Reply] = Future()
        self._queue.put(_Item(text, fut, time.perf_counter()))
        return await asyncio.wrap_future(fut)

    def counters(self) -> dict[str, int]:
        return {}

    async def aclose(self) -> None:
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)

    def _take_batch(self) -> tuple[list[_Item], bool]:
        first = self._queue.get()
        if first is None:
            return [], True
        batch, stop = [first], False
        while len(batch) < self._batch_size:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                stop = True
                break
            batch.append(nxt)
        # Requests cancelled while waiting (client gone) are dropped, never computed.
        return [b for b in batch if b.future.set_running_or_notify_cancel()], stop

    def _run(self, encode: Encode) -> None:
        stop = False
        while not stop:
            batch, stop = self._take_batch()
            if not batch:
                continue
            start = time.perf_counter()
            try:
                vectors = encode([b.text for b in batch])
            except Exception as e:  # an OOM or a bad input fails this batch, not the server
                for b in batch:
                    b.future.set_exception(e)
                continue
            for b, v in zip(batch, vectors, strict=True):
                b.future.set_result(Reply(np.asarray(v, dtype=np.float32), start - b.submitted))


def open_reference(spec: TargetSpec, token_budget: int | None) -> FifoBatcher:
    """A library baseline (`sentence-transformers:` or `hf:`, the shared references of
    embedders/) behind the FIFO batcher, loaded on its worker thread."""
    from embedserve.embedders import open_source

    def load() -> Encode:
        source = open_source(spec)
        return lambda texts: source.embed(texts, "")

    batch_size = spec.int_option("batch_size", 32) or 32
    return FifoBatcher(load, batch_size, torch.device(spec.option("device") or "cpu").type)
