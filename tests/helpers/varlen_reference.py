"""A plain-PyTorch stand-in for the flash varlen kernel, so CPU tests run VarlenAttention.

Independent of the routes under test: per sequence, an explicit bottom-right causal mask
and K/V heads repeated for GQA, then softmax(q k^T * scale) v in float32.
"""

from __future__ import annotations

import torch


def reference_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float,
) -> torch.Tensor:
    """q: [Tq, heads, d]; k, v: [Tk, kv_heads, d]; causal per sequence, aligned bottom-right."""
    groups = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
        assert q1 - q0 <= max_q and k1 - k0 <= max_k, "max_q / max_k smaller than a sequence"
        qs = q[q0:q1].float().transpose(0, 1)  # [heads, lq, d]
        ks = k[k0:k1].float().repeat_interleave(groups, dim=1).transpose(0, 1)
        vs = v[k0:k1].float().repeat_interleave(groups, dim=1).transpose(0, 1)
        lq, lk = q1 - q0, k1 - k0
        allowed = torch.arange(lk)[None, :] <= torch.arange(lk - lq, lk)[:, None]  # [lq, lk]
        scores = (qs @ ks.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[q0:q1] = (scores.softmax(-1) @ vs).transpose(0, 1).to(q.dtype)
    return out
