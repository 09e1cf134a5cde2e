"""int8 projections of a few rows on their own kernel (int8_short.cpp), reading the int8
weight oneDNN keeps in place and fusing `int8_rows.finish_rows`: one read of each weight byte
per call, where oneDNN's int8 matmul reorders the weight inside every call at a few rows.

A row's result is the same bytes as oneDNN's sums followed by `finish_rows` (integer sums,
then the same float operations in the same order), so a vector does not depend on whether
its step was short. `available()` checks exactly that here, on seeded problems, before any
weight takes the kernel; elsewhere oneDNN runs as before.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import cache

import torch

from embedserve.kernels import native
from embedserve.kernels.int8_rows import LEVELS, Rows, finish_rows, quantize_rows
from embedserve.kernels.short_linear import packed_address

log = logging.getLogger(__name__)
Kernel = Callable[..., int]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_QLINEAR = getattr(getattr(torch.ops, "onednn", None), "qlinear_pointwise", None)
_PREPACK = getattr(getattr(torch.ops, "onednn", None), "qlinear_prepack", None)
ONEDNN_INT8 = _QLINEAR is not None and _PREPACK is not None  # this PyTorch has oneDNN's int8 linear
# Rows up to which a step's projections take the kernel instead of oneDNN (measured on the
# 0.6B shapes: docs/quantization.md, "Short rows", its table of rows).
MAX_ROWS = 32
TILE = 64  # the kernel's output columns per tile: n must be a multiple, k one of 4


def onednn_sums(
    q: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor, w_zero: torch.Tensor
) -> torch.Tensor:
    """oneDNN's int8 matmul: [T, N] float32 sums of q[t, k] Wq[n, k] times w_scale[n]."""
    assert _QLINEAR is not None
    return _QLINEAR(q, 1.0, 0, packed, w_scale, w_zero, None, 1.0, 0, torch.float32, "none", [], "")


def prepack(wq: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed form of an int8 weight [N, K]."""
    assert _PREPACK is not None
    return _PREPACK(wq, None)


@cache
def _kernel() -> Kernel | None:
    lib = native.load("int8_short")
    if lib is None:
        return None
    fn = lib.embedserve_int8_short_linear
    fn.restype = ctypes.c_int
    fn.argtypes = [_PTR, _I64, _I64, _PTR, _I64, *[_PTR] * 6, _I64, _PTR, _PTR]
    return fn


def isa() -> str | None:
    """The dot product the kernel was built with here ("VNNI", "AVX2"), None where it was not."""
    lib = native.load("int8_short")
    return None if lib is None else {2: "VNNI", 1: "AVX2"}.get(lib.embedserve_int8_short_isa())


def reads(wq: torch.Tensor, packed: torch.Tensor) -> bool:
    """The kernel takes this weight: it works here (`available`), the shape fits its tiles, and
    oneDNN's packing of `wq` [N, K] is the layout it reads (`reads_layout`)."""
    n, k = wq.shape
    return not n % TILE and not k % 4 and available() and reads_layout(wq, packed)


def linear(
    rows: Rows, packed: torch.Tensor, w_scale: torch.Tensor, fix: torch.Tensor, bias: torch.Tensor,
    w_out: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """[T, N] float32: oneDNN's sums of the quantized rows then `finish_rows`, in one pass over
    a weight that `reads` accepted (float vectors dense float32 of the weight's N)."""
    kernel = _kernel()
    assert kernel is not None, "int8 short linear without its native kernel"
    m, k = rows.q.shape
    n = w_scale.shape[0]
    y = torch.empty(m, n)
    rc = kernel(
        rows.q.data_ptr(), m, k, packed_address(packed), n, w_scale.data_ptr(),
        rows.scale.data_ptr(), rows.zero.data_ptr(), fix.data_ptr(), bias.data_ptr(),
        rows.outliers.data_ptr(), w_out.shape[0], w_out.data_ptr(), y.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"native int8 short linear failed (code {rc}) on rows {m} x {k} -> {n}")
    return y


@cache
def available() -> bool:
    """The kernel built here and gives, bit for bit, oneDNN's sums followed by `finish_rows` on
    seeded problems (1 to MAX_ROWS rows, the largest levels, a k whose sums pass 2^24)."""
    if _kernel() is None or not ONEDNN_INT8:
        return False
    gen = torch.Generator().manual_seed(0)
    try:
        agrees = all(_agrees(n, k, n_out, gen) for n, k, n_out in ((128, 96, 8), (192, 1100, 70)))
    except RuntimeError as e:
        log.warning("the int8 short-rows kernel failed here: %s", e)
        return False
    if not agrees:
        log.warning("the int8 short-rows kernel disagreed with oneDNN here; short rows stay on oneDNN")
    return agrees


def _agrees(n: int, k: int, n_out: int, gen: torch.Generator) -> bool:
    wq = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    wq[0] = 127  # with levels of 127: the largest pair sums of AVX2's int16 step
    packed = prepack(wq)
    if not reads_layout(wq, packed):
        return False
    w_scale, fix, bias = (torch.rand(n, generator=gen) + 0.5 for _ in range(3))
    w_out, w_zero = torch.randn(n_out, n, generator=gen), torch.zeros(n, dtype=torch.long)
    outliers, mask = torch.arange(n_out) * (k // n_out), torch.zeros(k, dtype=torch.uint8)
    mask[outliers] = 1
    for m in (1, 2, 3, 4, 7, MAX_ROWS):
        x = torch.randn(m, k, generator=gen) * 3
        x[0] = torch.where(mask.bool(), x[0], torch.full((k,), 4.0))
        x[0, 1] = -1.0  # channel 1 is an inlier: zero point 25, 4.0 at level 127
        rows = quantize_rows(x, mask, outliers)
        want = finish_rows(onednn_sums(rows.q, packed, w_scale, w_zero), rows, fix, bias, w_out)
        got = linear(rows, packed, w_scale, fix, bias, w_out)
        if int(rows.q.max()) != LEVELS or not torch.equal(got, want):
            return False
    return True


def reads_layout(wq: torch.Tensor, packed: torch.Tensor) -> bool:
    """oneDNN's packing of `wq` [N, K] is plain [K][N] (the layout the kernel reads)."""
    n, k = wq.shape
    if not packed.is_mkldnn or int(torch.ops.mkldnn._nbytes(packed)) != n * k:
        return False
    raw = (ctypes.c_int8 * (n * k)).from_address(packed_address(packed))
    return torch.equal(torch.frombuffer(raw, dtype=torch.int8).view(k, n), wq.t())
