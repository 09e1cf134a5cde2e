"""Attention over one whole sequence, optionally within a band of keys (Gemma3's sliding layers).

A band of half-width w (query q sees key k when |q - k| < w, or 0 <= q - k < w when causal)
costs O(n * w), not a masked O(n^2): queries go in blocks of B rows, and each block reads only
the keys its rows can see:

    keys      0 ......... lo ======================== hi ......... n
    queries               |  w-1  | block [s, s+B) |  w-1  |       (causal: hi = s + B)

Inside the block the band's edges are a boolean mask. A key outside every row's band is never
read, so each row's softmax is the one of the full masked product (the same terms, fewer zeros).
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention.metadata import AttentionMetadata

# Query rows per block: about a band's width, so a block reads at most ~3 widths of keys.
_MIN_BLOCK = 128


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """[n, heads, d] -> [1, heads, n, d]."""
    return x.transpose(0, 1).unsqueeze(0)


def sequence_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int, causal: bool
) -> torch.Tensor:
    """q: [n, heads, d]; k, v: [m <= n, kv_heads, d] (bidirectional: the first m positions are
    keys, the rest queries only: ColBERT's unattended query expansion) -> [n, heads * d].
    `window` 0: every key (causal: every earlier key); w > 0: the band of half-width w."""
    n, m = q.shape[0], k.shape[0]
    if causal and m != n:
        raise ValueError("a causal sequence's positions are all keys")
    if not window or n <= window:  # the band holds every key a row may see
        o = scaled_dot_product_attention(
            heads_first(q), heads_first(k), heads_first(v), is_causal=causal, scale=scale, enable_gqa=True
        )
        return o.squeeze(0).transpose(0, 1).flatten(1)
    out = q.new_empty(n, q.shape[1] * q.shape[2])
    block = max(_MIN_BLOCK, window)
    pos = torch.arange(n, device=q.device)
    for s in range(0, n, block):
        e = min(n, s + block)
        lo = min(max(0, s - window + 1), m)
        hi = e if causal else min(m, e + window - 1)
        dist = pos[s:e, None] - pos[None, lo:hi]  # q - k
        mask = (dist < window) & (dist >= 0) if causal else dist.abs() < window
        if not bool(mask.any(dim=1).all()):
            raise ValueError(f"a query position sees no key within the window ({window}) of the first {m}")
        o = scaled_dot_product_attention(
            heads_first(q[s:e]),
            heads_first(k[lo:hi]),
            heads_first(v[lo:hi]),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[s:e] = o.squeeze(0).transpose(0, 1).flatten(1)
    return out


def banded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    window: int,
    causal: bool,
) -> torch.Tensor:
    """Every sequence of a step (packed, each whole) over its own keys (its first `keys` rows
    where the span says so): [T, heads * d]; rows of no sequence (bucket padding) are 0."""
    out = q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])
    for s in meta.seqs:
        rows = slice(s.q_start, s.q_start + s.q_len)
        keys = slice(s.q_start, s.q_start + (s.q_len if s.keys is None else s.keys))
        out[rows] = sequence_attention(q[rows], k[keys], v[keys], scale, window, causal)
    return out
