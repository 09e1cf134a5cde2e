"""float32 causal attention on the CPU through the native flash kernel (flash_attention.cpp).

PyTorch's CPU flash kernel computes its blocks with MKL's sgemm (half speed on AMD Zen) and
reads each KV head once per query head; the native kernel runs the same online-softmax
algorithm on oneDNN's brgemm with a KV head's query heads as rows of one tile. It is used
only after it matched a float64 reference on this machine (`available()`); elsewhere the
caller keeps PyTorch's flash.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import cache

import torch

from embedserve.kernels import native

log = logging.getLogger(__name__)
_Int64s = ctypes.c_int64 * 6
Kernel = Callable[..., int]  # (q, k, v, out pointers, dims, strides, scale) -> 0 on success


@cache
def _kernel() -> Kernel | None:
    lib = native.load("flash_attention")
    if lib is None:
        return None
    fn = lib.embedserve_flash_attention_f32
    fn.restype = ctypes.c_int
    ptr, int64s = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [ptr, ptr, ptr, ptr, int64s, int64s, ctypes.c_float]
    kernel: Kernel = fn
    return kernel


def _run(fn: Kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    v = v if v.stride(2) == 1 else v.contiguous()
    n, heads, d = q.shape
    kv_heads, kv, _ = k.shape
    out = torch.empty(n, heads * d, dtype=torch.float32)
    dims = _Int64s(n, heads, d, kv_heads, kv, 0)
    strides = _Int64s(q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    rc = fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dims, strides, scale)
    if rc != 0:
        shapes = ", ".join(f"{name} {tuple(x.shape)}" for name, x in (("q", q), ("k", k), ("v", v)))
        raise ValueError(f"flash_attention_f32 refused {shapes}")
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The same attention in float64 with an explicit mask (for checks, not for speed)."""
    n, heads, d = q.shape
    kv_heads, kv, _ = k.shape
    groups = heads // kv_heads
    qd, kd, vd = (x.double() for x in (q.transpose(0, 1), k, v))
    kd, vd = kd.repeat_interleave(groups, 0), vd.repeat_interleave(groups, 0)
    scores = (qd @ kd.transpose(1, 2)) * scale  # [heads, n, kv]
    visible = torch.arange(kv)[None, :] <= torch.arange(kv - n, kv)[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return (probs @ vd).transpose(0, 1).reshape(n, heads * d)


@cache
def available() -> bool:
    """The kernel built here and matches float64 on seeded problems that cross its tile and
    key-block edges (GQA 2, a prefix, a first chunk)."""
    fn = _kernel()
    if fn is None:
        return False
    gen = torch.Generator().manual_seed(0)
    for n, kv in ((300, 1100), (37, 37)):
        q, k, v = (torch.randn(*s, generator=gen) for s in ((n, 4, 16), (2, kv, 16), (2, kv, 16)))
        got = _run(fn, q, k, v, 0.25)
        if not torch.allclose(got.double(), reference(q, k, v, 0.25), rtol=1e-4, atol=1e-5):
            log.warning("native flash attention failed its self-check on this machine; using PyTorch's flash")
            return False
    return True


def flash_attention_f32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, heads, d] float32 at positions kv-n .. kv-1; k, v [kv_heads, kv, d] (any strides
    with a dense last dim). Query i sees keys 0 .. kv-n+i. Returns [n, heads * d].
    Call only where `available()`."""
    fn = _kernel()
    assert fn is not None, "flash_attention_f32 without the native kernel"
    return _run(fn, q, k, v, scale)
