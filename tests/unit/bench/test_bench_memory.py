"""PeakMemory: the peak over a cell and the memory at its start, in-process on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import psutil
import pytest

from embedserve.bench import memory
from embedserve.bench.memory import PeakMemory
from embedserve.worker.host_memory import release_free_heap


def test_peak_minus_start_is_what_the_cell_added() -> None:
    # Engines built earlier in this process keep freed heap pages resident for reuse, which
    # the buffer below could take without growing RSS; returned first, its pages are new.
    release_free_heap()
    with PeakMemory("cpu") as mem:
        buf = np.ones(256 << 20, dtype=np.uint8)  # written, so resident
        del buf
    assert mem.start is not None and mem.peak is not None
    assert (256 - 8) << 20 <= mem.peak - mem.start <= (256 + 32) << 20
    with PeakMemory("cpu") as idle:  # the next cell starts from the RSS now, not the old peak
        pass
    assert idle.start is not None and idle.peak is not None and idle.peak - idle.start < 32 << 20


def test_unknown_without_a_pid_for_a_remote_target() -> None:
    with PeakMemory("remote") as mem:
        pass
    assert (mem.peak, mem.start, mem.method) == (None, None, "n/a")


def test_served_tree_rss_counts_a_new_child_without_scanning_every_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The served sampler (every 20 ms) lists children at most every RESCAN_S: the scan
    covers all processes and, per sample, took ~9% of a core from the server it measured."""
    scans = 0
    real = psutil.Process.children

    def counted(self: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
        nonlocal scans
        scans += 1
        return real(self, recursive=recursive)

    monkeypatch.setattr(psutil.Process, "children", counted)
    monkeypatch.setattr(memory._Tree, "RESCAN_S", 0.3)
    grow = "import time; b = bytearray(160 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)"
    with PeakMemory("remote", pid=os.getpid()) as mem:  # this process stands for the server
        subprocess.run([sys.executable, "-c", grow], check=True)
    assert mem.start is not None and mem.peak is not None
    assert mem.peak - mem.start >= 120 << 20  # the child's pages, found by a rescan
    assert 3 <= scans <= 12  # ~1.5 s / 0.3 s, not one per 20 ms sample (~75)
