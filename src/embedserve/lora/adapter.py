"""A loaded adapter: its low-rank updates laid out on the engine's own (fused) projections."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class LoraWeights:
    """One projection's update for one adapter: y += (x A^T) B^T, float32, the scale folded into
    B. A fused projection (q|k|v, gate|up) has the A rows of each targeted part stacked and B
    block-diagonal over its output rows, so one pair of matmuls updates every part."""

    a_t: torch.Tensor  # [in, R]
    b_t: torch.Tensor  # [R, out]

    def update(self, x: torch.Tensor, cols: slice) -> torch.Tensor:
        """The update of rows x for output columns `cols`, in x's dtype."""
        return (x.float() @ self.a_t) @ self.b_t[:, cols]

    @property
    def nbytes(self) -> int:
        return self.a_t.numel() * self.a_t.element_size() + self.b_t.numel() * self.b_t.element_size()


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    name: str  # what a request's `model` field names it by
    path: str
    rank: int  # its largest module rank
    fingerprint: str  # of its files: enters its vectors' schema and its prefix-cache keys
    weights: Mapping[str, LoraWeights]  # the engine's projection (module name) -> its update

    @property
    def cache_root(self) -> bytes:
        """Where its requests' prefix-cache hash chains start: K/V computed under one adapter is
        never found by another's (or the base model's) requests."""
        return b"lora:" + self.fingerprint.encode()

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights.values())
