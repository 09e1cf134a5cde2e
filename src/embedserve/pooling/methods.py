"""Which rows of a chunk each pooling method reads, and how it folds them.

A chunk covers prompt positions [start, start + n). Only the rows a method needs leave the
model runner, so LAST pooling over a 16K prompt moves one row, not 16K.

    prompt:   0 1 2 ... E ... start ............ start+n ... P-1     (E: excluded_prefix)
    CLS:      ^ (position 0 only)
    MEAN:              [E, P) -- every position after the excluded prefix (a prompt)
    LAST:                                                         ^ (P-1 only)
    SPLADE:   [0, P) -- every position, folded through the model's sparse head (pooling/state.py)
"""

from __future__ import annotations

import torch

from embedserve.config import PoolingMethod


def rows_to_pool(
    method: PoolingMethod, start: int, n: int, num_prompt_tokens: int, excluded_prefix: int
) -> tuple[int, int]:
    """Local row range [lo, hi) of the chunk [start, start+n) that `method` reads."""
    end = start + n
    if method is PoolingMethod.LAST:
        last = num_prompt_tokens - 1
        return (last - start, last - start + 1) if start <= last < end else (0, 0)
    if method is PoolingMethod.CLS:
        return (0, 1) if start == 0 else (0, 0)
    if method is PoolingMethod.SPLADE:
        return 0, n  # every token, the prompt's included (sentence-transformers' SpladePooling)
    lo = min(max(excluded_prefix, start), end)
    return lo - start, end - start


def unread_prefix(method: PoolingMethod, num_prompt_tokens: int, excluded_prefix: int) -> int:
    """How many leading positions' rows `method` never reads: a prefix whose K/V comes from the
    prefix cache can go uncomputed (LAST: all but the last; MEAN: the excluded prompt; CLS: none)."""
    if method is PoolingMethod.LAST:
        return num_prompt_tokens - 1
    if method in (PoolingMethod.CLS, PoolingMethod.SPLADE):
        return 0
    return min(excluded_prefix, num_prompt_tokens - 1)


def fold(method: PoolingMethod, acc: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """Fold selected rows ([k, hidden]) into the accumulator (float32, [hidden])."""
    if rows.shape[0] == 0:
        return acc
    if method is PoolingMethod.MEAN:
        part = rows.float().sum(dim=0)
        return part if acc is None else acc + part
    # LAST and CLS read exactly one row, exactly once.
    if acc is not None:
        raise RuntimeError(f"{method.value} pooling row seen twice")
    return rows[0].float().clone()


def finalize(method: PoolingMethod, acc: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The pooled vector (MEAN divides; LAST, CLS and SPLADE's term weights are as folded)."""
    if method is PoolingMethod.MEAN:
        return acc / max(num_rows, 1)
    return acc
