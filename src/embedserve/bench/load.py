"""Load patterns: closed-loop clients, an open-loop stream, and a flood that runs until stopped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence

from embedserve.bench.stats import Sample
from embedserve.bench.target import BenchInput, Session

_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or any(m in str(e).lower() for m in _OOM_MARKERS)


def describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


async def timed(session: Session, text: BenchInput, num_tokens: int, priority: str) -> Sample:
    """One request; a failure becomes a Sample with its error (never raises, except cancel)."""
    t0 = time.perf_counter()
    try:
        reply = await session.embed(text, priority)
    except Exception as e:
        return Sample(num_tokens, time.perf_counter() - t0, None, error=describe(e), oom=is_oom(e))
    return Sample(num_tokens, time.perf_counter() - t0, reply.queue_s)


async def closed_loop(
    session: Session,
    texts: Sequence[BenchInput],
    tokens: Sequence[int],
    concurrency: int,
    priority: str = "online",
) -> tuple[list[Sample], float]:
    """`concurrency` clients, each sending its next request as soon as the last one returns."""
    todo: Iterator[int] = iter(range(len(texts)))
    samples: list[Sample | None] = [None] * len(texts)

    async def client() -> None:
        for i in todo:  # one shared iterator: every request is sent exactly once
            samples[i] = await timed(session, texts[i], tokens[i], priority)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(max(1, min(concurrency, len(texts))))))
    wall = time.perf_counter() - t0
    return [s for s in samples if s is not None], wall


async def open_loop(
    session: Session, texts: Sequence[BenchInput], tokens: Sequence[int], interval_s: float, priority: str
) -> list[Sample]:
    """Request i leaves at i * interval_s whatever happened to the others (a steady stream)."""
    t0 = time.perf_counter()
    tasks = []
    for i, text in enumerate(texts):
        delay = t0 + i * interval_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(timed(session, text, tokens[i], priority)))
    return list(await asyncio.gather(*tasks))


class Flood:
    """`clients` closed-loop senders cycling through long texts until `stop()`."""

    def __init__(
        self, session: Session, texts: Sequence[BenchInput], tokens: Sequence[int], clients: int
    ) -> None:
        self.samples: list[Sample] = []
        self._session, self._texts, self._tokens = session, texts, tokens
        self._stride = clients
        self._tasks = [asyncio.create_task(self._client(c)) for c in range(clients)]

    async def _client(self, offset: int) -> None:
        i = offset
        while True:
            k = i % len(self._texts)
            self.samples.append(await timed(self._session, self._texts[k], self._tokens[k], "batch"))
            i += self._stride

    async def stop(self) -> None:
        """Cancel in-flight documents (the target aborts them); completed ones stay counted."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
