"""What the test machine's CPU has, for skips that depend on the hardware, not on our code."""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path


@cache
def cpu_words() -> frozenset[str] | None:
    """Every word of /proc/cpuinfo (x86 `flags`, ARM `Features`, ...); None where it cannot be
    read (not Linux): the caller decides what an unknown CPU means."""
    if platform.system() != "Linux":
        return None
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return None
