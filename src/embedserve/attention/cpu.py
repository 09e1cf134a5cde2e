"""CPU attention: `causal_attention` for one sequence's chunk and `paged_attention` over a
packed step and the paged KV cache (the CPU's `AttentionFn`; see attention/metadata.py).

Which kernel takes a chunk is a pure choice (`cpu_route`) from its shape and dtype:

    a short whole sequence (no context, < SDPA_WHOLE_BELOW queries) -> one PyTorch SDPA call
    fp32 / bf16, >= NATIVE_MIN_ROWS queries, native kernel built     -> native flash kernel
    bf16 otherwise                                                   -> bf16 matmul tiles
    fp32 otherwise                                                   -> PyTorch flash, the
                                                  cached prefix and the chunk merged by LSE

Deterministic mode (`invariant`) sends every chunk with cached context that the native kernel
takes to it, whatever its rows: PyTorch's flash kernel splits a few queries' keys over the
threads it has, so their bytes would move with the thread count (fp32: 1 to 3 queries after
256+ keys), while the native kernel reduces each query's keys inside one task.

The numbers behind each threshold are in docs/performance.md ("CPU attention routes").
"""

from __future__ import annotations

import enum
from functools import cache

import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention.cpu_batched import (
    SDPA_WHOLE_BELOW,
    causal_mask,
    short_cached_together,
    short_whole_together,
)
from embedserve.attention.cpu_gemm import gemm_attention
from embedserve.attention.metadata import AttentionMetadata, real_rows, write_kv
from embedserve.kernels import flash_attention as native_flash


class CpuRoute(str, enum.Enum):
    NATIVE = "native-flash"  # kernels/flash_attention.cpp
    BF16_GEMM = "bf16-gemm"  # attention/cpu_gemm.py
    PYTORCH = "pytorch"  # SDPA (whole sequence), flash prefix + self merged, or a masked SDPA


# Queries from which the native kernel takes a chunk, per dtype: below, packing each KV head
# (K^T; bf16 also V) costs more than it saves.
NATIVE_MIN_ROWS = {torch.float32: 16, torch.bfloat16: 64}


def cpu_route(
    n: int, kv: int, dtype: torch.dtype, head_dim: int, native: bool, invariant: bool = False
) -> CpuRoute:
    """The route for n queries over kv keys (kv - n cached before them); `native`: the native
    kernel built and passed its self-check in `dtype`; `invariant`: bytes that do not depend on
    the thread count (deterministic mode)."""
    if kv == n and n < SDPA_WHOLE_BELOW:
        return CpuRoute.PYTORCH
    least = NATIVE_MIN_ROWS.get(dtype)
    paired = dtype != torch.bfloat16 or head_dim % 2 == 0  # bf16 brgemm pairs head_dim
    if native and least is not None and (n >= least or invariant) and paired:
        return CpuRoute.NATIVE
    return CpuRoute.BF16_GEMM if dtype == torch.bfloat16 else CpuRoute.PYTORCH


def _heads(x: torch.Tensor) -> torch.Tensor:
    """[n, heads, d] -> [1, heads, n, d], the layout SDPA takes."""
    return x.transpose(0, 1).unsqueeze(0)


# CPU flash attention that also returns each query's log-sum-exp (an ATen op SDPA itself
# calls on the CPU); None where this PyTorch build lacks it.
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@cache
def _flash_broadcasts_kv_heads() -> bool:
    """The CPU flash op takes fewer KV heads than query heads (query head h reading KV head
    h // groups) and agrees with expanded K/V. Expanding copied the whole prefix for every
    chunk, which cost more than its math."""
    assert _FLASH_LSE is not None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 5, 8, generator=gen) for h in (4, 2, 2))  # [1, heads, n, d]
    try:
        got = _FLASH_LSE(q, k, v, scale=0.5)[0]
    except RuntimeError:
        return False
    want = _FLASH_LSE(q, kv_expand(k[0], 2)[None], kv_expand(v[0], 2)[None], scale=0.5)[0]
    return bool(torch.allclose(got, want))


def _prefix_then_self(
    q: torch.Tensor,
    k_pre: torch.Tensor,
    v_pre: torch.Tensor,
    k_self: torch.Tensor,
    v_self: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a chunk over cached context, as two mask-free flash calls.

        keys:    | prefix 0 .. start-1 |  chunk start .. start+n-1 |
        query i: |   all visible       |  causal (keys <= i)       |

    Each part is exact softmax attention over its keys; their log-sum-exps weigh them back
    into one softmax over all keys. No [n, start + n] mask is built and flash can skip the
    chunk's upper triangle. q: [1, heads, len, d]; k_*, v_*: [1, heads or kv_heads, len, d].
    """
    assert _FLASH_LSE is not None
    o_pre, lse_pre = _FLASH_LSE(q, k_pre, v_pre, scale=scale)[:2]  # lse: [1, heads, n] fp32
    o_self, lse_self = _FLASH_LSE(q, k_self, v_self, is_causal=True, scale=scale)[:2]
    top = torch.maximum(lse_pre, lse_self)
    w_pre = torch.exp(lse_pre - top).unsqueeze(-1)
    w_self = torch.exp(lse_self - top).unsqueeze(-1)
    merged = (o_pre.float() * w_pre + o_self.float() * w_self) / (w_pre + w_self)
    return merged.to(q.dtype)


def causal_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    route: CpuRoute | None = None,
    out: torch.Tensor | None = None,
    invariant: bool = False,
) -> torch.Tensor:
    """One sequence's chunk: q [n, heads, d] at positions kv-n .. kv-1; keys, values
    [kv_heads, kv, d] (head-major: each head's keys one contiguous run when the caller keeps
    them so), every key up to the chunk's last position. Returns [n, heads * d], written into
    `out` where given (the native kernel writes there directly; other routes copy).
    `route`: force a route (benchmarks, tests); by default `cpu_route` picks it (`invariant`: see
    there).
    """
    o = _causal_attention(q, keys, values, scale, route, out, invariant)
    if out is None or o is out:
        return o
    return out.copy_(o)


def _causal_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    route: CpuRoute | None,
    out: torch.Tensor | None,
    invariant: bool = False,
) -> torch.Tensor:
    n, kv = q.shape[0], keys.shape[1]
    start = kv - n
    shaped = q.dim() == 3 and keys.dim() == 3 and values.shape == keys.shape and keys.shape[2] == q.shape[2]
    if not shaped or start < 0 or keys.shape[0] < 1 or q.shape[1] % keys.shape[0]:
        # ATen's flash kernels crash the process (SIGFPE) on some of these instead of raising
        raise ValueError(
            "causal attention takes q [n, heads, d] and keys, values [kv_heads, kv >= n, d] with heads"
            f" a multiple of kv_heads; got q {tuple(q.shape)}, keys {tuple(keys.shape)},"
            f" values {tuple(values.shape)}"
        )
    cpu = q.device.type == "cpu"
    if route is None:
        native = cpu and q.dtype in NATIVE_MIN_ROWS and native_flash.available(q.dtype)
        route = cpu_route(n, kv, q.dtype, q.shape[2], native, invariant) if cpu else CpuRoute.PYTORCH
    if route is CpuRoute.NATIVE:
        direct = out is not None and native_flash.takes_out(q, out)
        return native_flash.flash_attention(q, keys, values, scale, out if direct else None)
    if route is CpuRoute.BF16_GEMM:
        return gemm_attention(q, keys, values, scale)
    k4, v4 = keys.unsqueeze(0), values.unsqueeze(0)  # [1, kv_heads, kv, d], SDPA's layout
    if start == 0:  # no earlier context: plain causal attention over its own keys
        o = scaled_dot_product_attention(_heads(q), k4, v4, is_causal=True, scale=scale, enable_gqa=True)
    elif cpu and _FLASH_LSE is not None:
        groups = 1 if _flash_broadcasts_kv_heads() else q.shape[1] // keys.shape[0]
        o = _prefix_then_self(
            _heads(q),
            kv_expand(keys[:, :start], groups)[None],
            kv_expand(values[:, :start], groups)[None],
            kv_expand(keys[:, start:], groups)[None],
            kv_expand(values[:, start:], groups)[None],
            scale,
        )
    else:
        mask = causal_mask(n, kv, q.device)
        o = scaled_dot_product_attention(_heads(q), k4, v4, attn_mask=mask, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1).flatten(1)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
    route: CpuRoute | None = None,
) -> torch.Tensor:
    """q: [T, heads, d]; k, v: [T, kv_heads, d]; kv_cache: [2, slots, kv_heads, d] or None.

    Returns [T, heads * d]. Rows after the last sequence (bucket padding) never reach the
    cache and come out as zeros.
    """
    n = real_rows(meta)
    if kv_cache is not None and meta.slot_mapping is not None:
        write_kv(kv_cache, meta.slot_mapping, k, v, n)
    out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    out[n:] = 0
    done: set[int] = set()
    if route is None and meta.causal:
        done = short_whole_together(q, k, v, meta, scale, out)
        if kv_cache is not None:
            done |= short_cached_together(q, kv_cache, meta, scale, out)
    for s in meta.seqs:
        if s.q_start in done:
            continue
        rows = slice(s.q_start, s.q_start + s.q_len)
        if not meta.causal:  # an encoder: whole sequences, every token sees every (key) token
            seen = slice(s.q_start, s.q_start + (s.q_len if s.keys is None else s.keys))
            o = scaled_dot_product_attention(
                _heads(q[rows]), _heads(k[seen]), _heads(v[seen]), scale=scale, enable_gqa=True
            )
            out[rows] = o.squeeze(0).transpose(0, 1).flatten(1)
        elif s.kv_slots is None:
            keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
            causal_attention(q[rows], keys, values, scale, route, out[rows], meta.deterministic)
        else:  # the cache already holds this chunk's K/V (written above) after its context
            assert kv_cache is not None, "a chunk with cached context needs the KV cache"
            keys = kv_cache[0].index_select(0, s.kv_slots).transpose(0, 1)
            values = kv_cache[1].index_select(0, s.kv_slots).transpose(0, 1)
            causal_attention(q[rows], keys, values, scale, route, out[rows], meta.deterministic)
    return out


def kv_expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[kv_heads, n, d] -> [kv_heads * groups, n, d]: each KV head serves `groups` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=0)
