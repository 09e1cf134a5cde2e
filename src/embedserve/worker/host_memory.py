"""Give the C heap's free pages back to the OS after a long prompt.

A long prompt allocates activations of many sizes; glibc keeps what they freed inside its
arenas (only the top of a heap is ever returned), so the process stays as large as its
worst moment and holes of odd sizes pile up. `malloc_trim(0)` returns every free page of
every arena. Where the C library has no such call (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the heap's free pages to the OS; True if the C library could (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
