"""Output head: Matryoshka truncation, then L2 normalization (in that order)."""

from __future__ import annotations

import torch


def apply_head(vector: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """`vector`: [hidden] float32. Slice to `dimensions` first, then normalize the slice."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = torch.nn.functional.normalize(vector, p=2.0, dim=-1)
    return vector
