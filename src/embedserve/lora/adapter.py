"""A loaded adapter: its low-rank updates laid out on the engine's own (fused) projections."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Block:
    """One targeted part of a projection: B's rows for ranks [r0, r1) of A, output columns [c0, c1)."""

    r0: int
    r1: int
    c0: int
    c1: int
    b_t: torch.Tensor  # [r1 - r0, c1 - c0], the scale folded in


@dataclass(frozen=True, eq=False)
class LoraWeights:
    """One projection's update for one adapter, float32: y += (x A^T) B^T. A fused projection
    (q|k|v, gate|up) stacks the A rows of each targeted part, so one matmul projects every part
    down, and each part's B adds into its own output columns (no block-diagonal zeros)."""

    a_t: torch.Tensor  # [in, R]
    blocks: tuple[Block, ...]

    def add_to(self, y: torch.Tensor, x: torch.Tensor, cols: slice) -> None:
        """y += the update of rows x for the projection's output columns `cols` (y's columns are
        those), summed in float32; a float32 y takes it inside the second matmuls."""
        h = x.float() @ self.a_t
        lo, hi = cols.start or 0, self.width if cols.stop is None else cols.stop
        for b in self.blocks:
            c0, c1 = max(b.c0, lo), min(b.c1, hi)
            if c0 >= c1:
                continue
            part = b.b_t[:, c0 - b.c0 : c1 - b.c0]
            out = y[:, c0 - lo : c1 - lo]
            if y.dtype == torch.float32:
                out.addmm_(h[:, b.r0 : b.r1], part)
            else:
                out += (h[:, b.r0 : b.r1] @ part).to(y.dtype)

    def update(self, x: torch.Tensor, cols: slice) -> torch.Tensor:
        """The update of rows x for output columns `cols`, float32."""
        lo, hi = cols.start or 0, self.width if cols.stop is None else cols.stop
        out = x.new_zeros(x.shape[0], hi - lo, dtype=torch.float32)
        self.add_to(out, x, cols)
        return out

    @property
    def width(self) -> int:
        return max(b.c1 for b in self.blocks)

    @property
    def nbytes(self) -> int:
        return 4 * (self.a_t.numel() + sum(b.b_t.numel() for b in self.blocks))


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
