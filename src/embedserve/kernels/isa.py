"""What vector instructions this CPU gives the engine, after the caps an operator set.

Two questions decide CPU code paths:
- `kernel_isa()`: the widest ISA the native kernels are compiled for here (`amx`, `avx512`,
  `avx2`, or None off x86-64 or below AVX2 + FMA), the CPU's own unless EMBEDSERVE_CPU_ISA caps
  it (kernels/native.py passes the matching compiler flags).
- `bf16_dot_products()`: whether bfloat16 matmuls run on the hardware (AVX512_BF16, AMX-BF16;
  ARM's BF16). Without them oneDNN's bf16 matmuls run 2.7-5.6x slower than its float32
  (docs/performance.md, "AVX2-only CPUs"), so the engine runs float32 where bfloat16 was
  asked (`cpu_dtype`, called by engine/resolve.py); EMBEDSERVE_CPU_BF16=1 keeps bf16 weights
  computed in float32 instead (models/linear.py). ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16
  and EMBEDSERVE_CPU_ISA=avx2 count as "without".
"""

from __future__ import annotations

import logging
import os
import platform
from functools import cache
from pathlib import Path

import torch

from embedserve.settings import settings

log = logging.getLogger(__name__)

# oneDNN's ISA names in order (ONEDNN_MAX_CPU_ISA); bf16 dot products from AVX512_CORE_BF16 on
_ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
)


@cache
def cpuinfo_lines(keys: tuple[str, ...]) -> list[str] | None:
    """The first CPU's `/proc/cpuinfo` lines of these keys (None where unreadable)."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return None
    return [line for line in first.splitlines() if line.split(":")[0].strip() in keys]


def cpu_flags() -> frozenset[str]:
    """The first CPU's feature words (x86 `flags`, ARM `Features`); empty where unreadable."""
    lines = cpuinfo_lines(("flags", "Features")) or []
    return frozenset(w for line in lines for w in line.split(":", 1)[1].split())


def _x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def kernel_isa() -> str | None:
    """The ISA the native kernels are built for here: the CPU's widest, capped by
    EMBEDSERVE_CPU_ISA; None off x86-64 or without AVX2 + FMA."""
    flags = cpu_flags()
    if not _x86() or not {"avx2", "fma"} <= flags:
        return None
    own = "avx2"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        own = "amx" if {"amx_tile", "amx_bf16"} <= flags else "avx512"
    order = ("avx2", "avx512", "amx")
    cap = settings().cpu_isa or "amx"
    return order[min(order.index(own), order.index(cap))]


def bf16_dot_products() -> bool:
    """bfloat16 matmuls run on this CPU's hardware, as capped by EMBEDSERVE_CPU_ISA and
    ONEDNN_MAX_CPU_ISA (an unknown oneDNN name or an unreadable CPU: yes, as before)."""
    flags = cpu_flags()
    if not flags:
        return True
    if not _x86():
        return "bf16" in flags if platform.machine() in ("aarch64", "arm64") else True
    if settings().cpu_isa == "avx2" or not ({"avx512_bf16", "amx_bf16"} & flags):
        return False
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if onednn in _ONEDNN_ISAS:
        return _ONEDNN_ISAS.index(onednn) >= _ONEDNN_ISAS.index("AVX512_CORE_BF16")
    return True


def int8_dot_products() -> bool:
    """int8 matmuls run on dot-product instructions here (AVX-VNNI; AVX512-VNNI or AMX-INT8
    where EMBEDSERVE_CPU_ISA leaves AVX-512 / AMX on). Without them, AVX2's int8 dot product
    is two multiplies (`vpmaddubsw`, `vpmaddwd`) per 32 products, no faster than float32 FMAs
    (docs/quantization.md, "A CPU without VNNI")."""
    flags = cpu_flags()
    if not _x86():
        return False
    isa = kernel_isa()
    return "avx_vnni" in flags or (
        (isa in ("avx512", "amx") and "avx512_vnni" in flags) or (isa == "amx" and "amx_int8" in flags)
    )


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def parse_dtype(name: str) -> torch.dtype:
    """The dtype an option names (`--dtype`)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def cpu_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a CPU engine runs for the one asked: float32 for bfloat16 where the CPU has no
    bf16 dot products (a warning at each engine start, with the memory it costs), unless
    EMBEDSERVE_CPU_BF16=1."""
    if device.type != "cpu" or dtype != torch.bfloat16 or settings().cpu_bf16 or bf16_dot_products():
        return dtype
    log.warning(
        "bfloat16 asked, but this CPU has no bfloat16 dot products (AVX512_BF16 / AMX; "
        "EMBEDSERVE_CPU_ISA or ONEDNN_MAX_CPU_ISA may cap them): bf16 matmuls run 2.7-5.6x "
        "slower than float32 here, so the engine runs float32 (twice the weight memory; "
        "backend_profile cpu-fp32). EMBEDSERVE_CPU_BF16=1 keeps bf16 weights, computed in "
        "float32 (about 10% slower than float32, short queries more)."
    )
    return torch.float32
