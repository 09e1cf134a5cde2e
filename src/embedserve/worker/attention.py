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

import torch
from torch.nn.functional import scaled_dot_product_attention


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
    out = torch.empty_like(q)
    for s in meta.seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        if s.kv_slots is None:
            ks, vs = k[rows], v[rows]
            mask = None
            is_causal = meta.causal
        else:
            assert kv_cache is not None, "a chunk with cached context needs the KV cache"
            ks = kv_cache[0].index_select(0, s.kv_slots)
            vs = kv_cache[1].index_select(0, s.kv_slots)
            mask = _causal_mask(s.q_len, s.kv_len, q.device)
            is_causal = False
        o = scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),  # [1, heads, q_len, d]
            ks.transpose(0, 1).unsqueeze(0),  # [1, kv_heads, kv_len, d]
            vs.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o.squeeze(0).transpose(0, 1)
    return out.flatten(1)
