"""Projections of a few rows over int8 weights (weight-only int8, kernels/short_linear_w8.cpp):
the weight is streamed as one byte per value, widened and scaled into float32 in L1 per chunk,
and multiplied by short_linear_f32.cpp's own FMA passes.

A weight here is `Blocks`: int8 values in the passes' layout [N/64][K][64] and float32 scales
laid out alike, [N/64][K/G][64] (G values along k share a scale: G = K for one per output
channel, 32 for GGUF's Q8_0). W[n, k] = float(q[n, k]) * scale[n, k // G], one float32
rounding, so the kernel's results are the float32 kernel's on that dequantized weight, bit for
bit (`available` checks it here, on seeded weights, before any weight takes the kernel).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property

import torch

from embedserve.kernels import native, short_linear

log = logging.getLogger(__name__)
Kernel = Callable[..., int]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
BLOCK = 64  # output columns per block: a weight's rows are padded to a multiple
MAX_ROWS = 64  # the kernel's limit (its accumulators per thread: 4 groups of 16 rows)


class Ref(ctypes.Structure):
    """A weight as kernels/short_forward.cpp passes it to the `_ref` entry points."""

    _fields_ = [("q", _PTR), ("scales", _PTR), ("group", _I64)]


@dataclass(frozen=True)
class Blocks:
    """An int8 weight [rows, k] in the kernel's layout: `q` [R/64, k, 64] int8, `scales`
    [R/64, k/group, 64] float32 (R: `rows` rounded up to 64; the padding rows are zeros)."""

    q: torch.Tensor
    scales: torch.Tensor
    rows: int
    k: int
    group: int

    @classmethod
    def of(cls, q: torch.Tensor, scales: torch.Tensor) -> Blocks:
        """From plain int8 values [rows, k] and scales [rows, k / group]."""
        rows, k = q.shape
        group = k // scales.shape[1]
        if q.dtype != torch.int8 or scales.shape[0] != rows or scales.shape[1] * group != k:
            raise ValueError(
                f"int8 values {tuple(q.shape)} {q.dtype} and scales {tuple(scales.shape)} do not match"
            )
        pad = -rows % BLOCK
        q = torch.nn.functional.pad(q, (0, 0, 0, pad))
        scales = torch.nn.functional.pad(scales.float(), (0, 0, 0, pad), value=1.0)
        return cls(_blocked(q), _blocked(scales), rows, k, group)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [rows, k] the int8 values and scales stand for."""
        nb, k, _ = self.q.shape
        values = self.q.view(nb, k // self.group, self.group, BLOCK).float()
        values.mul_(self.scales[:, :, None, :])  # the kernel's one rounding
        return values.view(nb, k, BLOCK).permute(0, 2, 1).reshape(nb * BLOCK, k)[: self.rows]

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * 4

    @cached_property
    def ref(self) -> Ref:
        """This weight as the `_ref` entry points take it (it holds this object's addresses:
        keep the Blocks alive while it is used)."""
        return Ref(self.q.data_ptr(), self.scales.data_ptr(), self.group)


def _blocked(t: torch.Tensor) -> torch.Tensor:
    """[R, c] -> [R/64, c, 64]."""
    r, c = t.shape
    return t.view(r // BLOCK, BLOCK, c).permute(0, 2, 1).contiguous()


@cache
def _kernels() -> tuple[Kernel, Kernel] | None:
    lib = native.load("short_linear_w8")
    if lib is None:
        return None
    plain, gated = lib.embedserve_short_linear_w8, lib.embedserve_short_silu_gate_up_w8
    plain.restype = gated.restype = ctypes.c_int
    plain.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _I64]
    gated.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64]
    return plain, gated


@cache
def ref_entry_points() -> tuple[Kernel, Kernel] | None:
    """(plain, gated) taking a `Ref` where the float32 kernels take a packed weight (the same
    signatures: kernels/short_forward.py calls either); None where the library did not build."""
    lib = native.load("short_linear_w8")
    if lib is None:
        return None
    plain, gated = lib.embedserve_short_linear_w8_ref, lib.embedserve_short_silu_gate_up_w8_ref
    plain.restype = gated.restype = ctypes.c_int
    plain.argtypes = gated.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
    return plain, gated


def takes(x: torch.Tensor) -> bool:
    """x is rows the kernel takes, and few of them (their width is checked per weight)."""
    return x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == torch.float32 and x.stride(1) == 1


def _rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    if not takes(x) or x.shape[1] != k or x.device.type != "cpu":
        raise ValueError(
            f"the int8-weight kernel takes 1 to {MAX_ROWS} float32 CPU rows of {k},"
            f" got {x.dtype} {tuple(x.shape)}"
        )
    rows = x.shape[0]
    if rows > 1 and x.stride(0) < k:  # overlapping rows (an expanded tensor): the kernel reads dense rows
        x = x.contiguous()
    return x, x.stride(0) if rows > 1 else k


def _done(rc: int, w: Blocks) -> None:
    if rc != 0:
        raise RuntimeError(f"native int8-weight linear failed (code {rc}) on a [{w.rows}, {w.k}] weight")


def linear(x: torch.Tensor, w: Blocks, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, k] @ W^T (+ bias [n]) for an int8 weight."""
    kernels = _kernels()
    assert kernels is not None, "int8-weight linear without its native kernel"
    x, ldx = _rows(x, w.k)
    n = w.q.shape[0] * BLOCK
    if bias is not None:
        if bias.shape != (w.rows,):
            raise ValueError(f"the int8-weight linear takes a bias of {w.rows}, got {tuple(bias.shape)}")
        bias = (
            bias.float().contiguous()
            if n == w.rows
            else torch.nn.functional.pad(bias.float(), (0, n - w.rows))
        )
    y = torch.empty(x.shape[0], n)
    rc = kernels[0](
        x.data_ptr(), x.shape[0], w.k, ldx, w.q.data_ptr(), w.scales.data_ptr(), w.group,
        None if bias is None else bias.data_ptr(), n, y.data_ptr(), n,
    )  # fmt: skip
    _done(rc, w)
    return y if n == w.rows else y[:, : w.rows].contiguous()


def silu_gate_up(x: torch.Tensor, gate: Blocks, up: Blocks) -> torch.Tensor:
    """silu(x G^T) * (x U^T) for int8 G and U of one shape."""
    kernels = _kernels()
    assert kernels is not None, "int8-weight linear without its native kernel"
    if (gate.rows, gate.k, gate.group) != (up.rows, up.k, up.group):
        raise ValueError("silu_gate_up needs int8 gate and up weights of one shape and scale group")
    x, ldx = _rows(x, gate.k)
    n = gate.q.shape[0] * BLOCK
    y = torch.empty(x.shape[0], n)
    rc = kernels[1](
        x.data_ptr(), x.shape[0], gate.k, ldx, gate.q.data_ptr(), gate.scales.data_ptr(), up.q.data_ptr(),
        up.scales.data_ptr(), gate.group, n, y.data_ptr(), n,
    )  # fmt: skip
    _done(rc, gate)
    return y if n == gate.rows else y[:, : gate.rows].contiguous()


@cache
def available() -> bool:
    """The kernel built here and, on seeded int8 weights (per channel and in groups of 32, a
    padded row count, a bias, strided rows, 1 to 64 rows), gives the float32 short-rows
    kernel's bits on the dequantized weight where that kernel runs here, else torch's results
    to float32 rounding. A CPU without AVX2 + FMA is a quiet False."""
    if _kernels() is None:
        return False
    gen = torch.Generator().manual_seed(0)
    exact = short_linear.available(torch.float32)
    try:
        ok = True
        for rows_w, k, group in ((128, 96, 96), (100, 64, 32)):
            q = [torch.randint(-127, 128, (rows_w, k), generator=gen, dtype=torch.int8) for _ in range(2)]
            s = [torch.rand(rows_w, k // group, generator=gen) * 0.01 for _ in range(2)]
            w, u = (Blocks.of(a, b) for a, b in zip(q, s, strict=True))
            wf, uf = w.dequantized(), u.dequantized()
            bias = torch.randn(rows_w, generator=gen)
            for rows in (1, 7, 16, 33, 64):
                x = torch.randn(rows, 2 * k, generator=gen)[:, :k]
                want = x @ wf.t() + bias
                got = linear(x, w, bias)
                gated = silu_gate_up(x, w, u)
                want_gated = torch.nn.functional.silu(x @ wf.t()) * (x @ uf.t())
                ok = ok and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
                ok = ok and torch.allclose(gated, want_gated, rtol=1e-5, atol=1e-5)
                if exact and rows_w % BLOCK == 0 and rows <= short_linear.MAX_ROWS[torch.float32]:
                    # the float32 kernel reads the same layout, float32: oneDNN's packing
                    blocks = _blocked(wf)
                    packed = short_linear.Packed(blocks.data_ptr(), torch.float32, rows_w, k, tensor=blocks)
                    ok = ok and torch.equal(got, short_linear.linear(x, packed, bias))
    except (RuntimeError, ValueError) as e:
        log.warning("the int8-weight kernel failed here: %s", e)
        return False
    if not ok:
        log.warning("the int8-weight kernel disagreed with float32 here; int8 weights run dequantized")
    return ok
