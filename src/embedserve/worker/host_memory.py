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

The packed weights are read whole for every short step: on 4 KB pages that is a page walk
every 64 cache lines, and the software prefetches that stream them wait on those walks.
`on_huge_pages` moves a buffer's whole huge pages (2 MB on x86-64) onto huge pages in place
(Linux 6.1+ `MADV_COLLAPSE`, whatever the THP sysfs setting: the kernel copies them while the
process runs on; the same bytes). The 0.6B shape's projections, streamed for a short step,
run faster on them (docs/performance.md, 'Weights on huge pages').

Where the C library or the kernel has no such calls (not glibc for the heap's; macOS, older
Linux, a kernel without THP for huge pages) all of these do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

from torch import nn

from embedserve.models.packing import packed_buffers
from embedserve.settings import settings

log = logging.getLogger(__name__)

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1
_MADV_COLLAPSE = 25  # linux/mman.h, since 6.1
_PMD_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
# Seams between buffers merged into one range (`_adjacent_merged`): at most one 4 KB page, so
# both pages at a seam hold bytes of a buffer (mapped, in memory): nothing is faulted in.
_SEAM = 4096


def huge_page_size() -> int:
    """The kernel's huge page (its PMD size: 2 MB on x86-64, 32 or 512 MB on arm64 with 16 or
    64 KB base pages); 2 MB where it does not say."""
    try:
        return int(_PMD_SIZE.read_text())
    except (OSError, ValueError):
        return 2 << 20


HUGE_PAGE = huge_page_size()


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


def on_huge_pages(address: int, nbytes: int) -> int:
    """Move the whole huge pages (`HUGE_PAGE`) inside [address, address + nbytes) onto huge
    pages, in place; returns the bytes that moved (0 where the kernel refuses: no THP, no free
    huge page, not Linux). The edges, partial pages shared with other allocations, stay."""
    if address <= 0 or nbytes <= 0:
        return 0
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return 0
    madvise = _libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    if madvise is None:
        return 0
    # page by page: where memory is fragmented some pages move and others do not
    pages = range(start, end, HUGE_PAGE)
    return HUGE_PAGE * sum(madvise(page, HUGE_PAGE, _MADV_COLLAPSE) == 0 for page in pages)


def packed_on_huge_pages(model: nn.Module) -> int:
    """A packed model's weights (or int8 weights) onto huge pages (`on_huge_pages`;
    EMBEDSERVE_HUGE_PAGES=0: left as they are); returns the bytes that moved, logged with what
    it took."""
    if not settings().huge_pages:
        return 0
    began = time.perf_counter()
    buffers = sorted(set(packed_buffers(model)))  # a weight two modules share counts once
    if not buffers:
        return 0
    moved = sum(on_huge_pages(address, nbytes) for address, nbytes in _adjacent_merged(buffers))
    log.info(
        "packed weights on %d MB pages: %.0f of %.0f MB in %.2f s",
        HUGE_PAGE >> 20,
        moved / 2**20,
        sum(nbytes for _, nbytes in buffers) / 2**20,
        time.perf_counter() - began,
    )
    return moved


def _adjacent_merged(buffers: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Buffers that follow each other in memory, at most `_SEAM` bytes apart, as one range
    (glibc leaves 64 bytes of header between the packed weights here), so a huge page across
    the seam moves too (how much more moves that way: docs/performance.md, 'Weights on huge
    pages')."""
    merged: list[tuple[int, int]] = []
    for address, nbytes in sorted(buffers):
        if merged and 0 <= address - sum(merged[-1]) <= _SEAM:
            start = merged[-1][0]
            merged[-1] = (start, address + nbytes - start)
        else:
            merged.append((address, nbytes))
    return merged
