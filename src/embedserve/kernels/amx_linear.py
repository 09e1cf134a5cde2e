"""bfloat16 projections of a few rows on Intel AMX over oneDNN's packed weights (amx_linear.cpp).

A short query's forward pass is a read of every weight once; oneDNN's matmul reads them at a
few rows well below the machine's bandwidth, this kernel at about the bandwidth
(docs/performance.md, 'AMX for short rows'). It reads the packed weight `models/linear.py`
keeps, in place, so a weight takes it only where `packed_as_blocks` confirmed the layout.

Used only where the kernel built with AMX, the OS granted AMX's state, and it gave oneDNN's
bits on a seeded problem here (`available`); elsewhere the oneDNN matmul runs as before.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import cache

import torch

from embedserve.kernels import native

log = logging.getLogger(__name__)
Kernel = Callable[..., int]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
BLOCK = 32  # output columns per packed block; K and N are multiples of it
# Rows up to which the kernel runs instead of oneDNN. Its lead shrinks with the rows (the
# weights are read once either way, the tiles' work grows): 1.20x at 16 rows, 1.10x at 64,
# 1.03x at 128 on the 0.6B shapes (docs/performance.md, 'AMX for short rows'). Up to 32 rows
# it gives oneDNN's bits; beyond, oneDNN blocks the rows otherwise and rare elements round
# the other way.
MAX_ROWS = 64


@cache
def _kernels() -> tuple[Kernel, Kernel] | None:
    lib = native.load("amx_linear")
    if lib is None:
        return None
    plain, gated = lib.embedserve_amx_linear, lib.embedserve_amx_silu_gate_up
    plain.restype = gated.restype = ctypes.c_int
    plain.argtypes = gated.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
    return plain, gated


def packed_address(packed: torch.Tensor) -> int:
    """Where a oneDNN-packed (`torch._mkldnn`) tensor's bytes start."""
    return int(torch.ops.mkldnn.data_ptr(packed))


def packed_as_blocks(plain: torch.Tensor, packed: torch.Tensor) -> bool:
    """oneDNN's packing of `plain` [N, K] (bfloat16) is [N/32][K/2][32][2], the layout the
    kernel reads: checked element by element against the plain weight (both still alive)."""
    n, k = plain.shape
    if plain.dtype != torch.bfloat16 or n % BLOCK or k % BLOCK or not packed.is_mkldnn:
        return False
    if int(torch.ops.mkldnn._nbytes(packed)) != n * k * 2:
        return False
    raw = (ctypes.c_uint16 * (n * k)).from_address(packed_address(packed))
    blocks = torch.frombuffer(raw, dtype=torch.bfloat16).view(n // BLOCK, k // 2, BLOCK, 2)
    return torch.equal(blocks.permute(0, 2, 1, 3).reshape(n, k), plain)


def _call(
    kernel: Kernel, x: torch.Tensor, first: int, second: int | None, bias: torch.Tensor | None, n: int
) -> torch.Tensor:
    rows, k = x.shape
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.stride(1) != 1 or x.stride(0) < k:
        raise ValueError(
            f"amx linear takes bfloat16 CPU rows with a dense last dim, got {x.dtype} {tuple(x.shape)}"
        )
    y = torch.empty(rows, n, dtype=torch.bfloat16)
    extra = second if second is not None else (0 if bias is None else bias.data_ptr())
    rc = kernel(x.data_ptr(), rows, k, x.stride(0), first, extra or None, n, y.data_ptr(), n)
    if rc != 0:
        raise RuntimeError(f"native amx linear failed (code {rc}) on x {tuple(x.shape)} -> {n} columns")
    return y


def linear(x: torch.Tensor, weight: int, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x [rows, K] @ W^T (+ bias) for the packed weight at address `weight` (N = n columns)."""
    kernels = _kernels()
    assert kernels is not None, "amx linear without the native kernel"
    if bias is not None and (bias.dtype != torch.bfloat16 or bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(
            f"amx linear takes a dense bfloat16 bias of {n}, got {bias.dtype} {tuple(bias.shape)}"
        )
    return _call(kernels[0], x, weight, None, bias, n)


def silu_gate_up(x: torch.Tensor, gate: int, up: int, n: int) -> torch.Tensor:
    """silu(x G^T) * (x U^T) for packed G and U at those addresses, rounded as oneDNN's fused
    swish and product epilogues round."""
    kernels = _kernels()
    assert kernels is not None, "amx linear without the native kernel"
    return _call(kernels[1], x, gate, up, None, n)


@cache
def available() -> bool:
    """The kernel built with AMX here, and on seeded packed weights gives oneDNN's bits (plain,
    with a bias, strided rows, 1 to 33 rows) and oneDNN's fused silu product to bfloat16's
    rounding."""
    if _kernels() is None:
        return False
    gen = torch.Generator().manual_seed(0)
    n, k = 64, 96
    w, g, u = ((torch.randn(n, k, generator=gen) * 0.1).to(torch.bfloat16) for _ in range(3))
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    pointwise = torch.ops.mkldnn._linear_pointwise
    try:
        packs = [torch.ops.mkldnn._reorder_linear_weight(t, 512) for t in (w, g, u)]
        if not all(packed_as_blocks(t, p) for t, p in zip((w, g, u), packs, strict=True)):
            return False
        pw, pg, pu = (packed_address(p) for p in packs)
        ok = True
        for rows in (1, 7, 16, 33):
            x = torch.randn(rows, 2 * k, generator=gen).to(torch.bfloat16)[:, :k]
            ok = ok and torch.equal(linear(x, pw, None, n), pointwise(x, packs[0], None, "none", [], ""))
            ok = ok and torch.equal(linear(x, pw, bias, n), pointwise(x, packs[0], bias, "none", [], ""))
            want = pointwise.binary(x, pointwise(x, packs[1], None, "swish", [], ""), packs[2], None, "mul")
            got = silu_gate_up(x, pg, pu, n)
            ok = ok and torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-3)
    except (RuntimeError, ValueError) as e:
        log.warning("the AMX short-rows kernel failed here: %s", e)
        return False
    if not ok:
        log.warning("the AMX short-rows kernel disagreed with oneDNN here; short rows stay on oneDNN")
    return ok
