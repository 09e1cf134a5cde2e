"""A batch run: the lines left to do, a window of them in flight, each written as soon as it and
every line before it are answered (input order, bounded memory):

    input ──read──> [ 17 18 19 20 21 22 ... ]  window (--concurrency): in flight, any order
                      │ done, and all before it
                      └──────────> output (200) / errors (any other status, unreadable lines)

Stopping (Ctrl-C: `stop` set) sends nothing more, cancels what is in flight and writes what was
already answered; running again computes only the keys missing from both files (resume.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from embedserve.api.protocol import error_body
from embedserve.batch.format import BatchLine, Key, Result, answered, read_line
from embedserve.batch.resume import input_lines

Execute = Callable[[BatchLine], Awaitable[Result]]


def lines_left(path: Path, done: set[Key]) -> Iterator[BatchLine | Result]:
    """The input's lines whose key is not in `done`, read as they are needed."""
    for number, text in input_lines(path):
        item = read_line(number, text)
        key = item.custom_id if isinstance(item, BatchLine) else item.key
        if key not in done:
            yield item


class Sink:
    """The output and error files, appended to; the error file is created by its first line."""

    def __init__(self, output: Path, errors: Path) -> None:
        self.output = output.open("ab")
        self.errors_path = errors
        self._errors: IO[bytes] | None = None
        self.ok = 0
        self.failed = 0

    def write(self, result: Result) -> None:
        line = json.dumps(result.record(), ensure_ascii=False).encode() + b"\n"
        if result.ok:
            self.output.write(line)
            self.ok += 1
            return
        if self._errors is None:
            self._errors = self.errors_path.open("ab")
        self._errors.write(line)
        self.failed += 1

    def close(self) -> None:
        for f in (self.output, self._errors):
            if f is not None:
                f.close()


class Progress:
    """A plain progress line on stderr: lines, lines/s, tokens/s, ETA (redrawn in place on a
    terminal, a line every 10 s otherwise)."""

    def __init__(self, total: int, stream: IO[str] = sys.stderr) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.done = 0
        self.tokens = 0
        self.start = self._shown = time.monotonic()

    def add(self, result: Result) -> None:
        self.done += 1
        self.tokens += result.tokens
        now = time.monotonic()
        if now - self._shown >= (0.5 if self.tty else 10.0):
            self._shown = now
            self._show(now)

    def _show(self, now: float, end: str = "") -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        text = (
            f"{self.done}/{self.total} lines  {rate:.1f} lines/s  {self.tokens / elapsed:.0f} tok/s  "
            f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        )
        self.stream.write(("\r" + text + end) if self.tty else text + "\n")
        self.stream.flush()

    def close(self) -> None:
        self._show(time.monotonic(), "\n")


class Observer(Protocol):
    """What sees every written line (the CLI's Progress, an online batch's request_counts)."""

    def add(self, result: Result) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    ok: int  # lines written to the output file by this run
    failed: int  # lines written to the error file by this run
    interrupted: bool
    seconds: float


async def run(
    items: Iterable[BatchLine | Result],
    execute: Execute,
    sink: Sink,
    window: int | Callable[[], int],
    stop: asyncio.Event,
    progress: Observer,
) -> Outcome:
    """Every item answered (a Result is already one) and written in input order, at most `window`
    lines in flight (a callable: asked before each line); stops early once `stop` is set."""
    width = window if callable(window) else (lambda: window)
    pending: deque[asyncio.Task[Result] | Result] = deque()
    stopping = asyncio.ensure_future(stop.wait())
    start = time.monotonic()

    def write(result: Result) -> None:
        sink.write(result)
        progress.add(result)

    try:
        for item in items:
            if stop.is_set():
                break
            pending.append(
                asyncio.ensure_future(_safely(execute, item)) if isinstance(item, BatchLine) else item
            )
            await _drain(pending, write, width() - 1, stopping)
        if not stop.is_set():
            await _drain(pending, write, 0, stopping)
    finally:
        stopping.cancel()
        await _finish(pending, write)
        progress.close()
    return Outcome(sink.ok, sink.failed, stop.is_set(), time.monotonic() - start)


async def _drain(
    pending: deque[asyncio.Task[Result] | Result],
    write: Callable[[Result], None],
    keep: int,
    stopping: asyncio.Future[Any],
) -> None:
    """Write the answered head of `pending`; wait for the head while more than `keep` are left."""
    while pending:
        head = pending[0]
        if isinstance(head, asyncio.Task) and not head.done():
            if len(pending) <= keep or stopping.done():
                return
            await asyncio.wait((head, stopping), return_when=asyncio.FIRST_COMPLETED)
            continue
        pending.popleft()
        write(head.result() if isinstance(head, asyncio.Task) else head)


async def _finish(pending: deque[asyncio.Task[Result] | Result], write: Callable[[Result], None]) -> None:
    """After a stop: cancel what is in flight; write, in order, what was answered before."""
    tasks = [t for t in pending if isinstance(t, asyncio.Task)]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for item in pending:
        if not isinstance(item, asyncio.Task):
            write(item)
        elif not item.cancelled():
            write(item.result())
    pending.clear()


async def _safely(execute: Execute, line: BatchLine) -> Result:
    """An executor's bug answers its line 500 (as the server's `answered` does) and the run goes on."""
    try:
        return await execute(line)
    except Exception as e:
        message = f"internal error: {type(e).__name__}: {e}"
        return answered(line, 500, error_body(message, "server_error", 500))
