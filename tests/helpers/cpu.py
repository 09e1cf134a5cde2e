"""What the test machine's CPU has, for skips that depend on the hardware, not on our code."""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path
from typing import Any


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


def has(flag: str) -> bool:
    return flag in (cpu_words() or ())


def short_rows_dtypes() -> list[Any]:
    """bfloat16 and float32 as pytest params, each skipped where the host lacks what its
    short-rows kernel needs (AMX; AVX2 + FMA or AVX-512; a C++ compiler on x86-64). Skipped by the host,
    never by the kernels' own self-check: a broken kernel fails `available` and must fail
    the tests, not skip them. The host is the CPU as capped (EMBEDSERVE_CPU_ISA, and for bf16
    ONEDNN_MAX_CPU_ISA: kernels/isa.py): a suite run under the AVX2 caps is an AVX2-only host."""
    import pytest
    import torch

    from embedserve.kernels import isa, native

    built = native.compiler() is not None and platform.machine() == "x86_64"
    capped = isa.kernel_isa()  # the CPU's flags under the cap: "amx" needs amx_bf16, any needs AVX2 + FMA
    needs = (
        (torch.bfloat16, capped == "amx" and isa.bf16_dot_products(), "AMX (amx_bf16)"),
        (torch.float32, capped is not None, "AVX2 + FMA"),
    )
    return [
        pytest.param(
            dtype, marks=pytest.mark.skipif(not (built and allowed), reason=f"no {what} (or capped) or C++")
        )
        for dtype, allowed, what in needs
    ]
