"""Output head: Matryoshka truncation, then L2 normalization (in that order)."""

from __future__ import annotations

import torch


def apply_head(vector: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """`vector`: [hidden] float32 (or [n, hidden]: each row). Slice to `dimensions` first,
    then normalize the slice. Rows one by one: each has the bits of the same row alone (a
    [n, hidden] reduction may sum in another order)."""
    if vector.dim() == 2:
        return torch.stack([apply_head(row, dimensions, normalize) for row in vector])
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = torch.nn.functional.normalize(vector, p=2.0, dim=-1)
    return vector
