"""How the CPU engine uses the C heap: keep freed memory for reuse while work runs, give it
back to the OS when a long prompt ends or the engine goes idle.

glibc's defaults suit short-lived allocations badly here. A block of at least 32 MB (a
2,048-row unit's QKV or gate/up output) gets its own mmap, unmapped when freed, so the next
unit's block faults in again page by page (the kernel zeroes each one): tens of thousands of
page faults per layer of a 4K prompt (docs/performance.md, 'The C heap kept for reuse').
Smaller blocks come from the heap, which free() trims from the top. `keep_freed_heap` turns
both off, so a unit reuses the pages the previous one freed.

A long prompt allocates activations of many sizes; glibc keeps what they freed inside its
arenas, and holes of odd sizes pile up. `malloc_trim(0)` returns every free page of every
arena: the lane calls it when a prompt ends, the engine loop when it goes idle.

Where the C library has no such calls (musl, macOS) both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

from embedserve.settings import settings

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1


@cache
def _libc_function(name: str, argtypes: tuple[type, ...]) -> Callable[..., int] | None:
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


def release_free_heap() -> bool:
    """Return the heap's free pages to the OS; True if the C library could (glibc)."""
    trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


@cache
def keep_freed_heap() -> bool:
    """Make the process's C heap keep freed memory for reuse (process-wide, once): large
    blocks from the heap instead of an mmap each, no trim of the heap's top on free. True if
    the C library took both settings; EMBEDSERVE_HEAP_REUSE=0 leaves the defaults."""
    if not settings().heap_reuse:
        return False
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX))
