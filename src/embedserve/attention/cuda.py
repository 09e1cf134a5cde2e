"""Attention routes for CUDA: the same contract as `attention.cpu.paged_attention`.

`paged_attention` gives a chunk with cached context an explicit boolean mask and GQA-shaped
K/V. On CUDA that combination reaches no fused kernel (flash refuses explicit masks, the
memory-efficient kernel has no GQA), so SDPA falls back to its math backend and materializes
[heads, q_len, kv_len] scores: gigabytes per layer at 16K tokens. The two routes here avoid it:

- `lower_right_attention`: per sequence SDPA with a bottom-right causal bias
  (`causal_lower_right`), which SDPA sends to flash attention as is. No mask tensor.
- `VarlenAttention`: ONE flash varlen call per layer for the whole packed step. The new K/V
  are written to the cache first, then every sequence's keys (cached context and its own
  chunk) are gathered from the cache in one `index_select`:

      packed queries   |A0..A36|B50..B78|               cu_q = [0, 37, 66]
      gathered keys    |A0..A36|B0 ........ B78|         cu_k = [0, 37, 116]
      causal mask per sequence aligned bottom-right: query i of B sees keys 0 .. 50 + i

Both accept step inputs padded to a token bucket (worker/buckets.py), as the CPU route does:
rows after the last sequence are never written to the cache and come out as zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch.nn.attention.bias import causal_lower_right
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention.metadata import AttentionMetadata, real_rows, write_kv

# (q [Tq, heads, d], k [Tk, kv_heads, d], v, cu_q [S+1] int32, cu_k, max_q, max_k, scale) -> [Tq, heads, d]
VarlenKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, float], torch.Tensor
]
F = TypeVar("F", bound=Callable[..., Any])


def eager_only(fn: F) -> F:
    """Keep `fn` out of torch.compile graphs: per-step metadata is data-dependent Python."""
    disable: Any = torch.compiler.disable  # untyped in torch
    return cast(F, disable(fn))


def _pad_rows(out: torch.Tensor, total: int) -> torch.Tensor:
    if out.shape[0] == total:
        return out
    return torch.cat([out, out.new_zeros((total - out.shape[0], *out.shape[1:]))])


@eager_only
def lower_right_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, heads, d]; k, v: [T, kv_heads, d]; kv_cache: [2, slots, kv_heads, d] or None -> [T, heads*d]."""
    n = real_rows(meta)
    if kv_cache is not None and meta.slot_mapping is not None:
        write_kv(kv_cache, meta.slot_mapping, k, v, n)
    groups = q.shape[1] // k.shape[1]
    # The memory-efficient kernel (the fused one that takes float32) has no GQA: widen K/V.
    widen = groups > 1 and q.is_cuda and q.dtype == torch.float32
    parts = []
    for s in meta.seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        if s.kv_slots is None:
            seen = slice(s.q_start, s.q_start + (s.q_len if s.keys is None else s.keys))
            ks, vs = k[seen], v[seen]
        else:
            assert kv_cache is not None, "a chunk with cached context needs the KV cache"
            ks = kv_cache[0].index_select(0, s.kv_slots)
            vs = kv_cache[1].index_select(0, s.kv_slots)
        qh = q[rows].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, d]
        kh = ks.transpose(0, 1).unsqueeze(0)  # [1, kv_heads, kv_len, d]
        vh = vs.transpose(0, 1).unsqueeze(0)
        if widen:
            kh, vh = kh.repeat_interleave(groups, dim=1), vh.repeat_interleave(groups, dim=1)
        causal = meta.causal and s.q_len == s.kv_len
        bias = causal_lower_right(s.q_len, s.kv_len) if meta.causal and not causal else None
        o = scaled_dot_product_attention(
            qh, kh, vh, attn_mask=bias, is_causal=causal, scale=scale, enable_gqa=groups > 1 and not widen
        )
        parts.append(o.squeeze(0).transpose(0, 1))
    out = torch.cat(parts) if parts else q[:0]
    return _pad_rows(out, q.shape[0]).flatten(1)


@dataclass(frozen=True)
class VarlenPlan:
    """One step's varlen layout, shared by every layer of that step."""

    num_rows: int  # real (unpadded) packed rows
    cu_q: torch.Tensor  # [S+1] int32 query offsets
    cu_k: torch.Tensor  # [S+1] int32 offsets into the gathered keys
    max_q: int
    max_k: int
    kv_index: torch.Tensor  # [cu_k[-1]] cache slots to gather, sequence after sequence


def plan_varlen(meta: AttentionMetadata) -> VarlenPlan:
    if meta.slot_mapping is None:
        raise ValueError("varlen attention reads keys from the KV cache: the step has no slot mapping")
    q_lens = np.array([s.q_len for s in meta.seqs], dtype=np.int64)
    kv_lens = np.array([s.kv_len for s in meta.seqs], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    if any(s.q_start != int(off) for s, off in zip(meta.seqs, starts, strict=False)):
        raise ValueError("varlen attention needs sequences packed back to back from row 0, in order")
    device = meta.slot_mapping.device
    parts = [
        s.kv_slots if s.kv_slots is not None else meta.slot_mapping[s.q_start : s.q_start + s.q_len]
        for s in meta.seqs
    ]
    return VarlenPlan(
        num_rows=int(starts[-1]),
        cu_q=torch.from_numpy(starts.astype(np.int32)).to(device),
        cu_k=torch.from_numpy(np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)).to(device),
        max_q=int(q_lens.max(initial=0)),
        max_k=int(kv_lens.max(initial=0)),
        kv_index=torch.cat(parts) if parts else meta.slot_mapping[:0],
    )


class VarlenAttention:
    """`AttentionFn` over one varlen kernel call per layer.

    The plan depends only on the step's metadata, so it is built by the first layer and reused
    by the others (same `meta` object); the next step's metadata replaces it.
    """

    def __init__(self, kernel: VarlenKernel) -> None:
        self.kernel = kernel
        self._meta: AttentionMetadata | None = None
        self._plan: VarlenPlan | None = None

    def plan_for(self, meta: AttentionMetadata) -> VarlenPlan:
        if self._plan is None or self._meta is not meta:
            self._plan, self._meta = plan_varlen(meta), meta
        return self._plan

    @eager_only
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if kv_cache is None or meta.slot_mapping is None or not meta.causal:
            # Encoders keep no cache and attend both ways: one bidirectional step per sequence.
            return lower_right_attention(q, k, v, kv_cache, meta, scale)
        plan = self.plan_for(meta)
        n = plan.num_rows
        write_kv(kv_cache, meta.slot_mapping, k, v, n)
        keys = kv_cache[0].index_select(0, plan.kv_index)  # [cu_k[-1], kv_heads, d]
        values = kv_cache[1].index_select(0, plan.kv_index)
        out = self.kernel(q[:n], keys, values, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, scale)
        return _pad_rows(out, q.shape[0]).flatten(1)
