"""float32 and bfloat16 causal attention on the CPU through the native flash kernel
(flash_attention.cpp).

PyTorch's CPU flash kernel computes its blocks with MKL's sgemm (slow on AMD Zen) and reads
each KV head once per query head (docs/performance.md, 'fp32 attention: native flash
kernel'); the native kernel runs the same online-softmax algorithm on oneDNN's brgemm with a
KV head's query heads as rows of one tile. bf16 inputs give fp32 scores, softmax and
accumulation (bf16 probabilities into the second matmul); where oneDNN's brgemm has no bf16
(no AVX512_BF16 / AMX), bf16 inputs run the float32 kernel on float32 copies. It is used only
after it matched a float64 reference on this machine (`available(dtype)`); elsewhere the
caller keeps its PyTorch route.
"""

from __future__ import annotations

import ctypes
import logging
import platform
from collections.abc import Callable
from functools import cache

import torch

from embedserve.kernels import isa, native

log = logging.getLogger(__name__)
_Int64s = ctypes.c_int64 * 6
Kernel = Callable[..., int]  # (q, k, v, out pointers, dims, strides, scale) -> 0 on success
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the kernel's entry point per dtype
# the entry points a dtype may run on, in order of preference: bf16's own (bf16 brgemm), else
# bf16 storage with float32 math
_ENTRIES = {torch.float32: ("f32",), torch.bfloat16: ("bf16", "bf16_f32")}
# the self-check's (rtol, atol) vs float64: bf16 rounds q, the probabilities and the output
# (a mispacked or mis-masked kernel is off by O(1))
_TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


@cache
def _entry(name: str) -> Kernel | None:
    lib = native.load("flash_attention")
    if lib is None:
        return None
    fn = getattr(lib, f"embedserve_flash_attention_{name}")
    fn.restype = ctypes.c_int
    ptr, int64s = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [ptr, ptr, ptr, ptr, int64s, int64s, ctypes.c_float]
    kernel: Kernel = fn
    return kernel


@cache
def _kernel(dtype: torch.dtype) -> Kernel | None:
    """The first of the dtype's entry points that built here and passes `_matches_float64`."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return None
    names = _ENTRIES.get(dtype, ())
    for name in names:
        fn = _entry(name)
        if fn is None:
            return None
        if _matches_float64(fn, dtype):
            if name != names[0]:  # expected without bf16 dot products; else the fast entry broke
                level = logging.WARNING if isa.bf16_dot_products() else logging.INFO
                log.log(
                    level,
                    "native flash attention in %s computes in float32 here (its bf16 entry failed)",
                    dtype,
                )
            return fn
    log.warning("native flash attention failed its %s self-check here; not using it", dtype)
    return None


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError naming what the kernel cannot take (it reads raw pointers)."""

    def got() -> str:  # built only for the error: this runs once per layer unit
        return ", ".join(
            f"{name} {tuple(x.shape)} {x.dtype} on {x.device}"
            for name, x in zip("qkv", (q, k, v), strict=True)
        )

    same = all(x.dtype == q.dtype and x.device.type == "cpu" and x.dim() == 3 for x in (q, k, v))
    if q.dtype not in DTYPES or not same:
        raise ValueError(f"flash_attention takes 3-D float32 or bfloat16 CPU tensors of one dtype: {got()}")
    n, heads, d = q.shape
    kv_heads, kv, kd = k.shape
    if v.shape != k.shape or kd != d or min(n, heads, d, kv_heads) < 1 or heads % kv_heads or kv < n:
        raise ValueError(f"flash_attention needs k, v [kv_heads, kv >= n, d] for q [n, heads, d]: {got()}")
    if q.dtype == torch.bfloat16 and d % 2:
        raise ValueError(f"flash_attention in bfloat16 needs an even head_dim, got {got()}")


def _run(
    fn: Kernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel on inputs `_check` accepted, into `out` (`takes_out`) or a new tensor."""
    q = q if q.stride(2) == 1 else q.contiguous()  # kept alive by these names through the call
    k = k if k.stride(2) == 1 else k.contiguous()
    v = v if v.stride(2) == 1 else v.contiguous()
    n, heads, d = q.shape
    kv_heads, kv, _ = k.shape
    out = torch.empty(n, heads * d, dtype=q.dtype) if out is None else out
    dims = _Int64s(n, heads, d, kv_heads, kv, 0)
    strides = _Int64s(q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    rc = fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dims, strides, scale)
    if rc != 0:  # 1: shapes refused (checked above); 2: out of memory or a oneDNN error inside
        raise RuntimeError(
            f"native flash attention failed (code {rc}) on q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
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


def available(dtype: torch.dtype = torch.float32) -> bool:
    """The kernel built here (x86 with oneDNN: where its brgemm is the fast path it was made
    for) and one of its entry points for `dtype` matches float64 (`_matches_float64`)."""
    return _kernel(dtype) is not None


def _matches_float64(fn: Kernel, dtype: torch.dtype) -> bool:
    """`fn` matches float64 in `dtype` on seeded problems that cross the kernel's tile and
    key-block edges: GQA 2 with a prefix, a first chunk, and head_dim 128 with V read through
    a paged-cache view (rows kv_heads * d apart)."""
    rtol, atol = _TOLERANCE[dtype]
    gen = torch.Generator().manual_seed(0)
    cases = [((300, 4, 16), 1100), ((37, 4, 16), 37), ((40, 4, 128), 300)]
    for (n, heads, d), kv in cases:
        q = torch.randn(n, heads, d, generator=gen).to(dtype)
        k, v = torch.randn(2, kv, 2, d, generator=gen).to(dtype).transpose(1, 2)  # [2 kv_heads, kv, d] views
        try:
            got = _run(fn, q, k, v, 0.25)
        except RuntimeError:
            got = None
        if got is None or not torch.allclose(got.double(), reference(q, k, v, 0.25), rtol=rtol, atol=atol):
            return False
    return True


def takes_out(q: torch.Tensor, out: torch.Tensor) -> bool:
    """The kernel can write q's attention straight into `out`: [n, heads * d], q's dtype,
    contiguous (e.g. a row slice of a packed step's output: no copy of the result)."""
    n, heads, d = q.shape
    return out.shape == (n, heads * d) and out.dtype == q.dtype and out.is_contiguous()


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """q [n, heads, d] float32 or bfloat16 at positions kv-n .. kv-1; k, v [kv_heads, kv, d]
    of q's dtype (any strides with a dense last dim). Query i sees keys 0 .. kv-n+i. Returns
    [n, heads * d] in q's dtype, written into `out` where given (see `takes_out`). Call only
    where `available(q.dtype)`."""
    _check(q, k, v)
    if out is not None and not takes_out(q, out):
        got = f"{tuple(out.shape)} {out.dtype} for q {tuple(q.shape)}"
        raise ValueError(f"flash_attention writes into a contiguous [n, heads * d] out of q's dtype: {got}")
    fn = _kernel(q.dtype)
    assert fn is not None, f"flash_attention without the native {q.dtype} kernel"
    return _run(fn, q, k, v, scale, out)
