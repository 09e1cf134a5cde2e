"""Peak memory over one cell, measured the most exact way the target allows.

- in-process on CPU: the kernel's RSS high-water mark (VmHWM). Writing "5" to
  /proc/self/clear_refs resets it to the current RSS, so the value read after the cell is the
  true peak *during* the cell (no sampling gaps). Where that file is not writable the RSS is
  sampled every 5 ms by a thread instead.
- in-process on CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats.
- a served target with `pid=`: RSS of that process and its children, sampled every 20 ms
  (vLLM runs its engine core in a child process).
- a served target without a pid: unknown (None).

`start` is the same measure when the cell began (the loaded, warmed-up target), so
`peak - start` is the memory the cell's own work added: for a one-input cell, what that input
cost beyond the resident weights.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _own_hwm() -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("VmHWM missing from /proc/self/status")


def _reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        _own_hwm()
    except OSError:
        return False
    return True


class _Tree:
    """A process and its children. Listing children scans every process on the machine (a
    few ms): done at most every RESCAN_S; reading the known processes' RSS each sample is
    cheap. Scanning at every 20 ms sample took ~9% of a core from the measured server on a
    2-core box and slowed it by 9-11%."""

    RESCAN_S = 1.0

    def __init__(self, pid: int) -> None:
        import psutil

        self._root = psutil.Process(pid)
        self._members: list[psutil.Process] = []
        self._scanned = -float("inf")

    def rss(self) -> int:
        import psutil

        now = time.monotonic()
        if now - self._scanned >= self.RESCAN_S:
            self._members = [self._root, *self._root.children(recursive=True)]
            self._scanned = now
        total = 0
        for proc in self._members:
            try:
                total += proc.memory_info().rss
            except psutil.Error:  # a child that exited since the last scan
                continue
        return total


class _Sampler:
    def __init__(self, pid: int | None, interval: float) -> None:
        import os

        self._tree = _Tree(os.getpid() if pid is None else pid)
        self._interval = interval
        self._stop = threading.Event()
        self.start = self.peak = self._tree.rss()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._tree.rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._tree.rss())


class PeakMemory:
    """`with PeakMemory(device, pid) as m: ...` then `m.peak`, `m.start` (bytes or None) and `m.method`."""

    def __init__(self, device: str, pid: int | None = None) -> None:
        self.device = device
        self.pid = pid
        self.peak: int | None = None
        self.start: int | None = None
        self._sampler: _Sampler | None = None
        if device == "cuda":
            self.method = "torch.cuda.max_memory_allocated"
        elif device == "remote":
            self.method = "server RSS sampled every 20 ms (pid and children)" if pid else "n/a"
        else:
            self.method = "process VmHWM reset per cell" if _reset_hwm() else "own RSS sampled every 5 ms"

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = int(torch.cuda.memory_allocated())
        elif self.device == "remote":
            if self.pid:
                self._sampler = _Sampler(self.pid, 0.02)
        elif _reset_hwm():
            self.start = _own_hwm()  # just reset: the RSS now
        else:
            self._sampler = _Sampler(None, 0.005)
        if self._sampler is not None:
            self.start = self._sampler.start
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated())
        elif self._sampler is not None:
            self.peak = self._sampler.stop()
        elif self.device != "remote":
            self.peak = _own_hwm()
