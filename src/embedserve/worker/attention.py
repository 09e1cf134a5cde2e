"""Attention over packed tokens and a paged KV cache.

Tokens of all scheduled requests are packed into one sequence (no padding). For a request
whose chunk starts at prompt position `start`:

    KV cache (its blocks)   |k0 k1 ... k_{start-1}|      <- written by earlier steps
    this step               |                     |q0 q1 ... q_{n-1}|  (also written now)
    query i (position start+i) attends keys 0 .. start+i   (causal, aligned bottom-right)

A first chunk (start == 0) needs no cache read: its own keys are all it may see.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.kernels import flash_attention as native_flash
from embedserve.worker.gemm_attention import gemm_attention


@dataclass(frozen=True)
class SeqSpan:
    """One request's part of the packed batch."""

    q_start: int  # first row in the packed tensors
    q_len: int
    start: int  # prompt position of the first query == tokens already cached
    kv_slots: torch.Tensor | None  # [start + q_len] flat cache slots; None when start == 0

    @property
    def kv_len(self) -> int:
        return self.start + self.q_len


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step attention inputs, passed explicitly through the model (no globals)."""

    seqs: list[SeqSpan]
    slot_mapping: torch.Tensor | None  # [num_tokens] flat slots to write new K/V; None: no cache
    causal: bool = True


def _causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    # Bottom-right aligned: query i sits at position kv_len - q_len + i.
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    return k_pos <= q_pos  # [q_len, kv_len]


def _heads(x: torch.Tensor) -> torch.Tensor:
    """[n, heads, d] -> [1, heads, n, d], the layout SDPA takes."""
    return x.transpose(0, 1).unsqueeze(0)


# CPU flash attention that also returns each query's log-sum-exp (an ATen op SDPA itself
# calls on the CPU); None where this PyTorch build lacks it.
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)

# fp32 and bf16 on the CPU: the native flash kernel (kernels/flash_attention.cpp, oneDNN
# brgemm, GQA heads as rows) where it built and passed its self-check in that dtype, from
# NATIVE_MIN_ROWS queries: below, packing each KV head (K^T; bf16 also V) costs more than it
# saves. Set False to measure the PyTorch routes below.
CPU_NATIVE = True
NATIVE_MIN_ROWS = {torch.float32: 16, torch.bfloat16: 64}

# bf16 on the CPU under NATIVE_MIN_ROWS (or without the kernel): tiled bf16 matmuls beat the
# flash kernel 1.8-2.8x (worker/gemm_attention.py). Set False to measure flash instead.
CPU_BF16_GEMM = True

# A whole sequence shorter than this (a first chunk: its keys are its queries), e.g. a short
# query: one SDPA call. The routes above loop over KV heads in Python or pack each head, which
# costs more than the math: 16 tokens at the 0.6B shape took 1.48 ms a layer on the bf16
# tiles, 0.39 on the native kernel, 0.09 in SDPA (fp32 native 0.31 vs 0.08); even at 64.
CPU_SDPA_WHOLE_BELOW = 64


@cache
def _flash_broadcasts_kv_heads() -> bool:
    """The CPU flash op takes fewer KV heads than query heads (query head h reading KV head
    h // groups) and agrees with expanded K/V. Expanding copied the whole prefix for every
    chunk: 25 MB per (layer, chunk) at 12K tokens of a small model, more than its math."""
    assert _FLASH_LSE is not None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 5, 8, generator=gen) for h in (4, 2, 2))  # [1, heads, n, d]
    try:
        got = _FLASH_LSE(q, k, v, scale=0.5)[0]
    except RuntimeError:
        return False
    want = _FLASH_LSE(q, kv_expand(k[0], 2)[None], kv_expand(v[0], 2)[None], scale=0.5)[0]
    return bool(torch.allclose(got, want))


def _native(q: torch.Tensor) -> bool:
    """The native kernel takes this chunk: CPU, a dtype it has, enough queries, built here."""
    rows = NATIVE_MIN_ROWS.get(q.dtype)
    if not CPU_NATIVE or rows is None or q.shape[0] < rows:
        return False
    paired = q.dtype != torch.bfloat16 or q.shape[2] % 2 == 0  # bf16 brgemm pairs head_dim
    return paired and native_flash.available(q.dtype)


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


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence's chunk: q [n, heads, d] at positions kv-n .. kv-1; keys, values
    [kv_heads, kv, d] (head-major: each head's keys one contiguous run when the caller keeps
    them so), every key up to the chunk's last position. Returns [n, heads * d].
    """
    n, kv = q.shape[0], keys.shape[1]
    start = kv - n
    cpu = q.device.type == "cpu"
    tiled = cpu and (start > 0 or n >= CPU_SDPA_WHOLE_BELOW)  # a short whole sequence: SDPA
    if tiled and _native(q):
        return native_flash.flash_attention(q, keys, values, scale)
    if tiled and q.dtype == torch.bfloat16 and CPU_BF16_GEMM:
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
        mask = _causal_mask(n, kv, q.device)
        o = scaled_dot_product_attention(_heads(q), k4, v4, attn_mask=mask, scale=scale, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1).flatten(1)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, heads, d]; k, v: [T, kv_heads, d]; kv_cache: [2, slots, kv_heads, d] or None.

    Returns [T, heads * d].
    """
    if kv_cache is not None and meta.slot_mapping is not None:
        kv_cache[0].index_copy_(0, meta.slot_mapping, k)
        kv_cache[1].index_copy_(0, meta.slot_mapping, v)
    out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    for s in meta.seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        if not meta.causal:  # an encoder: whole sequences, every token sees every token
            o = scaled_dot_product_attention(
                _heads(q[rows]), _heads(k[rows]), _heads(v[rows]), scale=scale, enable_gqa=True
            )
            out[rows] = o.squeeze(0).transpose(0, 1).flatten(1)
        elif s.kv_slots is None:
            out[rows] = causal_attention(q[rows], k[rows].transpose(0, 1), v[rows].transpose(0, 1), scale)
        else:  # the cache already holds this chunk's K/V (written above) after its context
            assert kv_cache is not None, "a chunk with cached context needs the KV cache"
            keys = kv_cache[0].index_select(0, s.kv_slots).transpose(0, 1)
            values = kv_cache[1].index_select(0, s.kv_slots).transpose(0, 1)
            out[rows] = causal_attention(q[rows], keys, values, scale)
    return out


def kv_expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[kv_heads, n, d] -> [kv_heads * groups, n, d]: each KV head serves `groups` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=0)
