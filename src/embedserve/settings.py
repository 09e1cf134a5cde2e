"""The process's environment switches, read once: native kernels, their cache, compiler and ISA
cap, the C heap's reuse, weight packing, huge pages, the short-rows kernels and bfloat16 on CPUs
without bf16 dot products (the README's table lists them).

Each switch changes how a CPU engine runs, never which vector it returns (beyond the rounding
the README states), so they are environment variables for A/B runs rather than engine options.
An empty variable counts as unset; a value outside the accepted ones raises `SettingsError`
instead of being read as "on".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from embedserve.errors import SettingsError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    value = environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    accepted = " | ".join(_TRUE + _FALSE)
    raise SettingsError(f"{name}={environ[name]!r} is not a switch: use one of {accepted} (empty: default)")


def _text(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(name, "").strip() or None


CPU_ISAS = ("avx2", "avx512", "amx")  # EMBEDSERVE_CPU_ISA's caps, narrowest first


def _isa(environ: Mapping[str, str]) -> str | None:
    value = (_text(environ, "EMBEDSERVE_CPU_ISA") or "").lower()
    if value and value not in CPU_ISAS:
        accepted = " | ".join(CPU_ISAS)
        raise SettingsError(
            f"EMBEDSERVE_CPU_ISA={environ['EMBEDSERVE_CPU_ISA']!r}: use one of {accepted}"
            " (empty: the CPU's own)"
        )
    return value or None


@dataclass(frozen=True)
class Settings:
    """What the environment asked for; defaults are what an unset variable means."""

    native_kernels: bool = True  # EMBEDSERVE_NATIVE_KERNELS: build and use kernels/*.cpp
    kernel_cache: Path | None = None  # EMBEDSERVE_KERNEL_CACHE: None is ~/.cache/embedserve/kernels
    heap_reuse: bool = True  # EMBEDSERVE_HEAP_REUSE: keep freed C heap for reuse (glibc mallopt)
    prepack: bool = True  # EMBEDSERVE_PREPACK: pack CPU weights once for oneDNN
    short_rows: bool = True  # EMBEDSERVE_SHORT_ROWS: few rows on kernels/short_linear*.cpp
    huge_pages: bool = True  # EMBEDSERVE_HUGE_PAGES: packed weights moved onto 2 MB pages
    cxx: str | None = None  # CXX: the compiler command (may hold flags); None is g++ / c++ on PATH
    cpu_isa: str | None = None  # EMBEDSERVE_CPU_ISA: cap the native kernels' ISA (CPU_ISAS); None: the CPU's
    cpu_bf16: bool = False  # EMBEDSERVE_CPU_BF16: bfloat16 even on a CPU without bf16 dot products
    cpu_int8: bool = False  # EMBEDSERVE_CPU_INT8: int8 even on a CPU without int8 dot products (VNNI, AMX)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Raises SettingsError naming the variable and the accepted values for a bad switch."""
        cache_dir = _text(environ, "EMBEDSERVE_KERNEL_CACHE")
        return cls(
            native_kernels=_flag(environ, "EMBEDSERVE_NATIVE_KERNELS", cls.native_kernels),
            kernel_cache=Path(cache_dir) if cache_dir else None,
            heap_reuse=_flag(environ, "EMBEDSERVE_HEAP_REUSE", cls.heap_reuse),
            prepack=_flag(environ, "EMBEDSERVE_PREPACK", cls.prepack),
            short_rows=_flag(environ, "EMBEDSERVE_SHORT_ROWS", cls.short_rows),
            huge_pages=_flag(environ, "EMBEDSERVE_HUGE_PAGES", cls.huge_pages),
            cxx=_text(environ, "CXX"),
            cpu_isa=_isa(environ),
            cpu_bf16=_flag(environ, "EMBEDSERVE_CPU_BF16", cls.cpu_bf16),
            cpu_int8=_flag(environ, "EMBEDSERVE_CPU_INT8", cls.cpu_int8),
        )


@cache
def settings() -> Settings:
    """The process's settings, read from os.environ on first use (tests clear the cache)."""
    return Settings.from_env(os.environ)
