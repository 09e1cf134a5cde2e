"""The per-token steps around the int8 matmul (models/int8_linear.py), in one pass per row on
the native kernel (int8_rows.cpp) where it built and matched the PyTorch ops on a check
(`native_ok()`), else as those PyTorch ops: both give the same bytes for the quantized rows.

- `quantize_rows(x, mask, outliers)`: each row's inlier channels (mask 0) onto 0..127 with its
  own scale and zero point; the outlier channels' values copied out.
- `finish_rows(sums, ...)`: oneDNN's int8 sums back to the projection's float32 output, in place.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import torch

from embedserve.kernels import native

LEVELS = 127  # activations in 0..127 (models/int8_linear.py says why 7 bits)
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
Kernel = Callable[..., int]


class Rows(NamedTuple):
    q: torch.Tensor  # [T, K] uint8
    scale: torch.Tensor  # [T] float32
    zero: torch.Tensor  # [T] float32: the zero point, an integer
    outliers: torch.Tensor  # [T, k] float32: the outlier channels' values


@cache
def _kernels() -> tuple[Kernel, Kernel] | None:
    lib = native.load("int8_rows")
    if lib is None:
        return None
    quantize, finish = lib.embedserve_int8_quantize_rows, lib.embedserve_int8_finish_rows
    quantize.restype = finish.restype = ctypes.c_int
    quantize.argtypes = [_PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR]
    finish.argtypes = [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR]
    return quantize, finish


def _checked() -> tuple[Kernel, Kernel] | None:
    """The native kernels where they built and passed `native_ok`, else None."""
    return _kernels() if native_ok() else None


def quantize_rows(x: torch.Tensor, mask: torch.Tensor, outliers: torch.Tensor) -> Rows:
    """x [T, K] float32 (dense), mask [K] uint8 (1: an outlier channel), outliers [k] long."""
    kernels = _checked()
    if kernels is None:
        return _quantize_torch(x, mask, outliers)
    return _quantize_native(kernels[0], x, mask, outliers)


def finish_rows(
    sums: torch.Tensor, rows: Rows, fix: torch.Tensor, bias: torch.Tensor, w_out: torch.Tensor
) -> torch.Tensor:
    """sums [T, N] (oneDNN's sum of q Wq times w_scale) -> sums * s - (z s) fix + bias +
    outliers @ w_out, in place where it can; w_out [k, N]."""
    kernels = _checked()
    if kernels is None:
        return _finish_torch(sums, rows, fix, bias, w_out)
    return _finish_native(kernels[1], sums, rows, fix, bias, w_out)


def _quantize_native(kernel: Kernel, x: torch.Tensor, mask: torch.Tensor, outliers: torch.Tensor) -> Rows:
    rows, k_in = x.shape
    out = Rows(
        torch.empty(rows, k_in, dtype=torch.uint8), torch.empty(rows), torch.empty(rows),
        torch.empty(rows, outliers.numel()),
    )  # fmt: skip
    rc = kernel(
        x.data_ptr(), rows, k_in, mask.data_ptr(), outliers.data_ptr(), outliers.numel(),
        out.q.data_ptr(), out.scale.data_ptr(), out.zero.data_ptr(), out.outliers.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"native int8 quantize_rows failed (code {rc}) on x {tuple(x.shape)}")
    return out


def _finish_native(
    kernel: Kernel, sums: torch.Tensor, rows: Rows, fix: torch.Tensor, bias: torch.Tensor, w_out: torch.Tensor
) -> torch.Tensor:
    n_rows, n = sums.shape
    rc = kernel(
        sums.data_ptr(), n_rows, n, rows.scale.data_ptr(), rows.zero.data_ptr(), fix.data_ptr(),
        bias.data_ptr(), rows.outliers.data_ptr(), w_out.shape[0], w_out.data_ptr(),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"native int8 finish_rows failed (code {rc}) on sums {tuple(sums.shape)}")
    return sums


def _finish_torch(
    sums: torch.Tensor, rows: Rows, fix: torch.Tensor, bias: torch.Tensor, w_out: torch.Tensor
) -> torch.Tensor:
    # elementwise, one outlier channel at a time: each row's result whatever the row count
    # (a matmul over the rows may pick another kernel, and sum order, by their number)
    y = sums.mul_(rows.scale[:, None]).sub_((rows.zero * rows.scale)[:, None] * fix).add_(bias)
    for j in range(w_out.shape[0]):
        y.add_(rows.outliers[:, j : j + 1] * w_out[j])
    return y


def _quantize_torch(x: torch.Tensor, mask: torch.Tensor, outliers: torch.Tensor) -> Rows:
    inliers = x.masked_fill(mask.bool(), 0.0)
    lo, hi = torch.aminmax(inliers, dim=1)
    scale = (hi.clamp_(min=0) - lo.clamp_(max=0)).div_(LEVELS).clamp_(min=1e-30)
    zero = lo.div_(scale).neg_().round_()
    q = inliers.div_(scale[:, None]).add_(zero[:, None]).round_().clamp_(0, LEVELS).to(torch.uint8)
    return Rows(q, scale, zero, x[:, outliers])


@cache
def native_ok() -> bool:
    """The native kernel built here and gives the PyTorch ops' bytes (quantized rows, scales,
    zero points) and their outputs within float32 rounding, on a seeded problem."""
    kernels = _kernels()
    if kernels is None:
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 96, generator=gen) * torch.rand(37, 1, generator=gen) * 4
    x[3] = 0.0  # a row of zeros: the smallest scale
    x[5] = x[5].abs()  # a row without negatives: zero point 0
    outliers = torch.tensor([2, 40, 41, 95])
    mask = torch.zeros(96, dtype=torch.uint8)
    mask[outliers] = 1
    shapes = ((37, 64), (64,), (64,), (4, 64))
    sums, fix, bias, w_out = (torch.randn(*shape, generator=gen) for shape in shapes)
    want, got = _quantize_torch(x, mask, outliers), _quantize_native(kernels[0], x, mask, outliers)
    if not all(torch.equal(a, b) for a, b in zip(want, got, strict=True)):
        return False
    expect = _finish_torch(sums.clone(), want, fix, bias, w_out)
    return torch.allclose(_finish_native(kernels[1], sums.clone(), got, fix, bias, w_out), expect, atol=1e-5)
