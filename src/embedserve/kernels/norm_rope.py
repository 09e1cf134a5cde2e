"""RMSNorm (with the residual add before it) and Qwen3's q/k norm plus RoPE on the CPU in
float32 and bfloat16 through the native kernel (norm_rope.cpp): one pass per row instead of
a chain of PyTorch elementwise ops, each a pass into a fresh tensor. bfloat16 rows are
computed in float32 and rounded where the PyTorch ops in bfloat16 round.

Used per dtype only after it matched the PyTorch ops on this machine (`available(dtype)`);
elsewhere the model keeps them. Callers pass CPU tensors of one dtype with a dense last
dimension.
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
_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the kernels' entry points per dtype
# the self-check's (rtol, atol) against the PyTorch ops: bfloat16 results may differ by one
# rounding where float32 sums of squares in another order cross a rounding boundary
_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}


@cache
def _kernels(dtype: torch.dtype) -> tuple[Kernel, Kernel] | None:
    lib = native.load("norm_rope")
    if lib is None or dtype not in DTYPES:
        return None
    suffix = DTYPES[dtype]
    add_norm, qk = (
        getattr(lib, f"embedserve_add_rms_norm_{suffix}"),
        getattr(lib, f"embedserve_qk_norm_rope_{suffix}"),
    )
    add_norm.restype = qk.restype = ctypes.c_int
    add_norm.argtypes = [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _F32]
    qk.argtypes = [_PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _F32]
    return add_norm, qk


def entry_points(dtype: torch.dtype) -> tuple[Kernel, Kernel] | None:
    """The dtype's (add_rms_norm, qk_norm_rope) ctypes functions, None where they did not build."""
    return _kernels(dtype)


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _fits(dtype: torch.dtype, *xs: torch.Tensor | None) -> bool:
    """Every given tensor is a CPU tensor of `dtype`, one the kernels take."""
    return dtype in DTYPES and all(x is None or (x.dtype == dtype and x.device.type == "cpu") for x in xs)


def native_for(x: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """The kernels run here for x with `others` (weights, rotary tables): CPU tensors of one
    dtype they take, whose self-check passed on this machine."""
    return _fits(x.dtype, x, *others) and available(x.dtype)


def _row_stride(x: torch.Tensor) -> int:
    """How far apart the kernel reads x's rows: one row reads the same at any row stride."""
    return x.stride(0) if x.shape[0] > 1 else x.shape[1]


def takes_rows(x: torch.Tensor) -> bool:
    """x is [rows, n] with each row dense and rows not overlapping: what `add_rms_norm` reads."""
    return x.dim() == 2 and x.stride(1) == 1 and _row_stride(x) >= x.shape[1]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x [rows, n] (rows may be strided): x += residual in place when given, then returns
    weight * x * rsqrt(mean(x^2) + eps) as a new [rows, n] tensor, all of x's dtype."""
    rows, n = x.shape
    if (
        not _fits(x.dtype, x, residual, weight)
        or x.stride(1) != 1
        or weight.shape != (n,)
        or weight.stride(0) != 1
    ):
        raise ValueError(
            f"add_rms_norm takes float32 or bfloat16 CPU x [rows, n] and weight [n] of one dtype:"
            f" {tuple(x.shape)} {x.dtype}, {tuple(weight.shape)} {weight.dtype}"
        )
    kernels = _kernels(x.dtype)
    assert kernels is not None, "add_rms_norm without the native kernel"
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"add_rms_norm needs a dense residual of x's shape {tuple(x.shape)}")
    stride = _row_stride(x)
    if stride < n:
        raise ValueError(f"add_rms_norm needs rows of x apart by at least n, got stride {stride} for n {n}")
    out = torch.empty(rows, n, dtype=x.dtype)
    rc = kernels[0](
        x.data_ptr(), stride, _ptr(residual), out.data_ptr(), weight.data_ptr(), rows, n, eps
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"native add_rms_norm failed (code {rc}) on x {tuple(x.shape)}")
    return out


def qk_norm_rope(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    weights: tuple[torch.Tensor, torch.Tensor] | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> None:
    """In place on qkv [rows, (heads + 2 kv_heads) * d] (the fused projection's output): each q
    and k head normed by weights (q's, k's; None: no q/k norm) then rotated by cos, sin
    [rows, d], all of qkv's dtype. v is left as it is."""
    rows, d = cos.shape
    tables = cos.is_contiguous() and sin.is_contiguous() and sin.shape == cos.shape
    dense = qkv.dim() == 2 and qkv.stride(1) == 1 and qkv.shape == (rows, (heads + 2 * kv_heads) * d)
    normed = weights is None or all(
        w.shape == (d,) and w.is_contiguous() and _fits(qkv.dtype, w) for w in weights
    )
    if not (_fits(qkv.dtype, qkv, cos, sin) and tables and dense and normed):
        raise ValueError(
            "qk_norm_rope takes float32 or bfloat16 CPU qkv [rows, (heads + 2 kv_heads) d], dense cos, sin"
            f" [rows, d] and norm weights of one dtype; got qkv {tuple(qkv.shape)} {qkv.dtype},"
            f" cos {tuple(cos.shape)} {cos.dtype}, heads {heads}/{kv_heads}"
        )
    kernels = _kernels(qkv.dtype)
    assert kernels is not None, "qk_norm_rope without the native kernel"
    q_w, k_w = (None, None) if weights is None else weights
    rc = kernels[1](
        qkv.data_ptr(), qkv.stride(0), rows, heads, kv_heads, d, _ptr(q_w), _ptr(k_w),
        cos.data_ptr(), sin.data_ptr(), eps,
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"native qk_norm_rope failed (code {rc}) on qkv {tuple(qkv.shape)}")


def _reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The decoder's RMSNorm in PyTorch ops: float32 math, rounded to x's dtype before the weight."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@cache
def available(dtype: torch.dtype = torch.float32) -> bool:
    """The kernels for `dtype` built here and equal the PyTorch ops in that dtype on a seeded
    problem (strided rows, a residual, Qwen3's q/k norm, RoPE tables with distinct angles)."""
    if _kernels(dtype) is None:
        return False
    gen = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, d, eps = 37, 4, 2, 16, 1e-6

    def rand(*shape: int, low: float | None = None) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen) if low is None else torch.rand(*shape, generator=gen) + low
        return t.to(dtype)

    x = rand(rows, 3 * d)[:, :d]  # rows 3 * d apart
    residual, weight = rand(rows, d), rand(d, low=0.5)
    want_x = x + residual
    want = _reference_norm(want_x, weight, eps)
    qkv = rand(rows, (heads + 2 * kv_heads) * d)
    q_w, k_w = rand(d, low=0.5), rand(d, low=0.5)
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * torch.rand(d // 2, generator=gen)
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(dtype) for f in (torch.cos, torch.sin))
    q, k, v = torch.split(qkv, [heads * d, kv_heads * d, kv_heads * d], dim=-1)
    want_q, want_k = (
        _reference_rope(_reference_norm(t.reshape(rows, -1, d), w, eps), cos[:, None], sin[:, None])
        for t, w in ((q, q_w), (k, k_w))
    )
    want_v = v.clone()
    rtol, atol = _TOLERANCE[dtype]
    try:
        got = add_rms_norm(x, residual, weight, eps)
        qk_norm_rope(qkv, heads, kv_heads, (q_w, k_w), cos, sin, eps)
        pairs = ((got, want), (x, want_x), (q.reshape(rows, -1, d), want_q), (k.reshape(rows, -1, d), want_k))
        close = all(torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol) for a, b in pairs)
        close = close and torch.equal(v, want_v)
    except (RuntimeError, ValueError):
        close = False
    if not close:
        log.warning("native norm/RoPE kernels failed their self-check here in %s; using PyTorch ops", dtype)
        return False
    return True
