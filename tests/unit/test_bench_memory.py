"""PeakMemory: the peak over a cell and the memory at its start, in-process on the CPU."""

from __future__ import annotations

import numpy as np

from embedserve.bench.memory import PeakMemory


def test_peak_minus_start_is_what_the_cell_added() -> None:
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
