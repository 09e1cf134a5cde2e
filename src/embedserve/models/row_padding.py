"""Row counts oneDNN is called with: a few per octave, so that it builds few primitives.

oneDNN builds a primitive for each row count it meets; `padded_rows` rounds a step's rows up to
one of 16 counts per octave, and `rows_padded` appends the zero rows (rows are computed
independently, so the real rows' bits are those of an exact call)."""

from __future__ import annotations

import torch

# Row counts up to this run oneDNN as they are; above it, padded (`padded_rows`).
PAD_ABOVE = 32


def padded_rows(rows: int) -> int:
    """The row count oneDNN is called with for `rows`: above `PAD_ABOVE`, rounded up to a
    multiple of 1/16 to 1/32 of it (a power of two: 16 per octave). oneDNN builds a primitive
    for each row count it meets and keeps the last 1,024 (and ideep as many), about 0.4 MB each
    whatever the shape; batched steps of ever-different sizes built new ones at every step (a few
    ms each) and their churn among the activations fragmented the heap without end."""
    if rows <= PAD_ABOVE:
        return rows
    granule = 1 << (rows.bit_length() - 5)
    return -(-rows // granule) * granule


def rows_padded(x: torch.Tensor, minimum: int = 0) -> torch.Tensor:
    """x with zero rows appended up to `padded_rows` (at least `minimum`; a copy), or x itself."""
    rows = x.shape[0] if x.dim() == 2 else 0
    target = max(padded_rows(rows), minimum if rows else 0)
    if target == rows:
        return x
    out = x.new_empty(target, x.shape[1])
    out[:rows] = x
    out[rows:].zero_()
    return out
