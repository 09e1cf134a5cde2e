"""Projections of a few rows over oneDNN's packed weights, read in place: bfloat16 on Intel AMX
(short_linear.cpp), float32 on AVX-512 or AVX2 FMAs (short_linear_f32.cpp).

A short query's forward pass is a read of every weight once; oneDNN's matmul reads them at a
few rows well below the machine's bandwidth, these kernels at about the bandwidth
(docs/performance.md, 'Short rows on their own kernels'). They read the packed weight
`models/linear.py` keeps, so a weight takes them only where `packed_as_blocks` confirmed the
layout against its plain copy.

Used per dtype only where the kernel built here (AMX with the OS granting its state; AVX-512 or
AVX2 + FMA, as capped by EMBEDSERVE_CPU_ISA)
and matched oneDNN on a seeded problem (`available`); elsewhere oneDNN runs as before.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import torch

from embedserve.kernels import isa, native

log = logging.getLogger(__name__)
Kernel = Callable[..., int]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# per dtype: the kernel's source, its entry points' suffix, the packed block's output columns
# and what K must be a multiple of
_KERNELS = {
    torch.bfloat16: ("short_linear", "bf16", 32, 32),
    torch.float32: ("short_linear_f32", "f32", 64, 1),
}
# Rows up to which each dtype's kernel runs instead of oneDNN. The lead shrinks with the rows
# (the weights are read once either way, the arithmetic grows) and is gone past these counts
# on the 0.6B shapes (docs/performance.md, "Short rows on their own kernels", its table of
# rows). bfloat16 gives oneDNN's bits up to 32 rows; beyond, oneDNN blocks the rows otherwise
# and rare elements round the other way. float32 sums k in order, oneDNN in its own order:
# about one float32 rounding apart.
MAX_ROWS = {torch.bfloat16: 64, torch.float32: 32}


@cache
def _kernels(dtype: torch.dtype) -> tuple[Kernel, Kernel] | None:
    if dtype not in _KERNELS:
        return None
    source, suffix, _, _ = _KERNELS[dtype]
    lib = native.load(source)
    if lib is None:
        return None
    plain, gated = (
        getattr(lib, f"embedserve_short_linear_{suffix}"),
        getattr(lib, f"embedserve_short_silu_gate_up_{suffix}"),
    )
    plain.restype = gated.restype = ctypes.c_int
    plain.argtypes = gated.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
    if dtype == torch.float32:
        _check_cap(lib.embedserve_short_f32_lanes())
    return plain, gated


def _check_cap(lanes: int) -> None:
    """Say so where the compiler built wider passes than EMBEDSERVE_CPU_ISA allows (a compiler
    whose -march=native turns on AVX10, which -mno-avx512f does not take away)."""
    want = {"avx2": 8, "avx512": 16, "amx": 16}.get(isa.kernel_isa() or "", lanes)
    if lanes > want:
        log.warning(
            "the fp32 short-rows kernel was built for %d-float registers, wider than the ISA cap", lanes
        )


def entry_points(dtype: torch.dtype) -> tuple[Kernel, Kernel] | None:
    """The dtype's (plain, gated) ctypes functions, None where the library did not build."""
    return _kernels(dtype)


class Unsupported(RuntimeError):
    """The kernel was built without its instruction set here, or the OS refused AMX's state."""


@dataclass(frozen=True)
class Packed:
    """A oneDNN-packed [n, k] weight the kernels read: where its bytes start, what they hold,
    and the packed tensor itself (held, so the bytes live as long as this does; a module
    compares it with its parameter to see the weight was not replaced since)."""

    address: int
    dtype: torch.dtype
    n: int
    k: int
    tensor: torch.Tensor = field(compare=False, repr=False)


def packed_address(packed: torch.Tensor) -> int:
    """Where a oneDNN-packed (`torch._mkldnn`) tensor's bytes start."""
    return int(torch.ops.mkldnn.data_ptr(packed))


def reads(plain: torch.Tensor, packed: torch.Tensor) -> Packed | None:
    """`packed` as the kernels read it, where its dtype's kernel works here and the packing is
    its layout (`packed_as_blocks`); else None."""
    if not available(plain.dtype) or not packed_as_blocks(plain, packed):
        return None
    n, k = plain.shape
    return Packed(packed_address(packed), plain.dtype, n, k, tensor=packed)


def packed_as_blocks(plain: torch.Tensor, packed: torch.Tensor) -> bool:
    """oneDNN's packing of `plain` [N, K] is the layout the dtype's kernel reads, checked
    element by element against the plain weight (both still alive): bfloat16
    [N/32][K/2][32][2] (AMX's pairs), float32 [N/64][K][64]."""
    if plain.dtype not in _KERNELS or plain.dim() != 2 or not packed.is_mkldnn:
        return False
    (n, k), (_, _, block, k_multiple) = plain.shape, _KERNELS[plain.dtype]
    size = plain.element_size()
    if n % block or k % k_multiple or int(torch.ops.mkldnn._nbytes(packed)) != n * k * size:
        return False
    raw = (ctypes.c_uint8 * (n * k * size)).from_address(packed_address(packed))
    flat = torch.frombuffer(raw, dtype=plain.dtype)
    plain = plain.contiguous()
    if plain.dtype == torch.bfloat16:  # both as [n/32][k/2][32][2], views: no copy of the weight
        packed_view = flat.view(n // block, k // 2, block, 2)
        plain_view = plain.view(n // block, block, k // 2, 2).permute(0, 2, 1, 3)
    else:  # [n/64][k][64]
        packed_view = flat.view(n // block, k, block)
        plain_view = plain.view(n // block, block, k).permute(0, 2, 1)
    return torch.equal(packed_view, plain_view)


def _call(w: Packed, x: torch.Tensor, extra: int | None, gated: bool) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != w.k or x.dtype != w.dtype or x.device.type != "cpu" or x.stride(1) != 1:
        raise ValueError(
            f"short linear takes {w.dtype} CPU rows [rows, {w.k}] with a dense last dim,"
            f" got {x.dtype} {tuple(x.shape)} on {x.device}"
        )
    kernels = _kernels(w.dtype)
    assert kernels is not None, f"short linear without the native kernel for {w.dtype}"
    rows, k = x.shape
    if rows > 1 and x.stride(0) < k:  # overlapping rows (an expanded tensor): the kernel reads dense rows
        x = x.contiguous()
    y = torch.empty(rows, w.n, dtype=w.dtype)
    ldx = x.stride(0) if rows > 1 else k
    rc = kernels[gated](x.data_ptr(), rows, k, ldx, w.address, extra, w.n, y.data_ptr(), w.n)
    if rc == 1:
        raise Unsupported(f"the short-rows kernel for {w.dtype} is not built for this CPU")
    if rc != 0:
        raise RuntimeError(f"native short linear failed (code {rc}) on x {tuple(x.shape)} -> {w.n} columns")
    return y


def linear(x: torch.Tensor, weight: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, k] @ W^T (+ bias [n]) for a packed weight [n, k]."""
    if bias is not None and (
        bias.dtype != weight.dtype or bias.shape != (weight.n,) or not bias.is_contiguous()
    ):
        raise ValueError(
            f"short linear takes a dense {weight.dtype} bias of {weight.n},"
            f" got {bias.dtype} {tuple(bias.shape)}"
        )
    return _call(weight, x, None if bias is None else bias.data_ptr(), gated=False)


def silu_gate_up(x: torch.Tensor, gate: Packed, up: Packed) -> torch.Tensor:
    """silu(x G^T) * (x U^T) for packed G and U of one shape (bfloat16: rounded where oneDNN's
    fused swish and product epilogues round)."""
    if (gate.dtype, gate.n, gate.k) != (up.dtype, up.n, up.k):
        raise ValueError(f"silu_gate_up needs gate and up of one shape and dtype, got {gate} and {up}")
    return _call(gate, x, up.address, gated=True)


@cache
def available(dtype: torch.dtype) -> bool:
    """The dtype's kernel built here with its instruction set, reads oneDNN's packing, and on
    seeded weights gives oneDNN's results (plain, with a bias, strided rows, 1 to 33 rows;
    bfloat16 bit for bit up to 32 rows) and oneDNN's fused silu product to the dtype's
    rounding. A CPU without the instruction set (no AMX; neither AVX-512 nor AVX2) is a quiet False."""
    if dtype == torch.bfloat16 and isa.kernel_isa() != "amx":
        return False  # AMX tiles are its instruction set (an AVX2 CPU cannot even pack bf16)
    if _kernels(dtype) is None:
        return False
    gen = torch.Generator().manual_seed(0)
    n, k = 128, 96
    w, g, u = ((torch.randn(n, k, generator=gen) * 0.1).to(dtype) for _ in range(3))
    bias = torch.randn(n, generator=gen).to(dtype)
    pointwise = torch.ops.mkldnn._linear_pointwise
    rtol, atol = (1e-2, 1e-3) if dtype == torch.bfloat16 else (1e-5, 1e-5)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bf16 beyond 32 rows: oneDNN blocks otherwise
        exact = dtype == torch.bfloat16 and a.shape[0] <= 32
        return torch.equal(a, b) if exact else torch.allclose(a.float(), b.float(), rtol, atol)

    try:
        packs = [torch.ops.mkldnn._reorder_linear_weight(t, 512) for t in (w, g, u)]
        if not all(packed_as_blocks(t, p) for t, p in zip((w, g, u), packs, strict=True)):
            return False
        pw, pg, pu = (Packed(packed_address(p), dtype, n, k, tensor=p) for p in packs)
        ok = True
        for rows in (1, 7, 16, 32, 33):
            x = torch.randn(rows, 2 * k, generator=gen).to(dtype)[:, :k]
            ok = ok and same(linear(x, pw), pointwise(x, packs[0], None, "none", [], ""))
            ok = ok and same(linear(x, pw, bias), pointwise(x, packs[0], bias, "none", [], ""))
            want = pointwise.binary(x, pointwise(x, packs[1], None, "swish", [], ""), packs[2], None, "mul")
            ok = ok and torch.allclose(silu_gate_up(x, pg, pu).float(), want.float(), rtol, atol)
    except Unsupported as e:
        log.debug("%s; oneDNN runs short rows", e)
        return False
    except (RuntimeError, ValueError) as e:
        log.warning("the short-rows kernel for %s failed here: %s", dtype, e)
        return False
    if not ok:
        log.warning(
            "the short-rows kernel for %s disagreed with oneDNN here; short rows stay on oneDNN", dtype
        )
    return ok
