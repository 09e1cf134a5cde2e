"""MPNet's relative position bias: one learned score per (bucket of k - q, head), shared by every
layer and added to the scaled scores before the softmax.

Buckets (T5-style, bidirectional; B buckets, max_distance 128): keys after the query take the
upper half. Within a half, |k - q| < B/4 has a bucket each; farther distances share B/4
log-spaced buckets up to 128, the rest the last one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from embedserve.models.registry import RELATIVE_BUCKETS

_MAX_DISTANCE = 128


def relative_buckets(n: int, num_buckets: int, device: torch.device) -> torch.Tensor:
    """[n, n] bucket of (query i, key j), as transformers' MPNet computes it."""
    pos = torch.arange(n, dtype=torch.long, device=device)
    dist = pos[:, None] - pos[None, :]  # q - k: negative for keys after the query
    half = num_buckets // 2
    bucket = (dist < 0).long() * half
    dist = dist.abs()
    exact = half // 2
    far = exact + (torch.log(dist.float() / exact) / math.log(_MAX_DISTANCE / exact) * (half - exact)).to(
        torch.long
    )
    far = torch.clamp(far, max=half - 1)
    return bucket + torch.where(dist < exact, dist, far)


class RelativeBias(nn.Module):
    def __init__(self, rows: int, heads: int) -> None:
        """`rows`: the table's size (relative_attention_num_buckets, at least RELATIVE_BUCKETS)."""
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, heads))

    def forward(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """[1, heads, n, n] in `dtype`: an additive attention mask for one sequence of n tokens."""
        buckets = relative_buckets(n, RELATIVE_BUCKETS, self.weight.device)
        return nn.functional.embedding(buckets, self.weight).permute(2, 0, 1).unsqueeze(0).to(dtype)
