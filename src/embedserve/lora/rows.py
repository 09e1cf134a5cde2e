"""Which rows of a step run which adapter, and the low-rank updates added to them.

The engine sets one `LoraRows` around a forward pass whose rows use adapters (`running`). A
projection an adapter targets computes its base matmul over every row of the step once, then
adds x_a A^T B^T on that adapter's rows only (segmented, as Punica / S-LoRA do): the base
weights are read once per step however many adapters share it, and no merged copy exists.

A step's projections see two row counts: its tokens, and the rows pooling reads (the last
layer runs its output projection and MLP on those only). A padded step (token buckets) has
more rows than tokens; its padding rows are no one's and get no update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from embedserve.lora.adapter import LoraAdapter

Rows = slice | torch.Tensor  # a contiguous range, or row indices
Groups = list[tuple[LoraAdapter, Rows]]
_ALL = slice(None)


@dataclass(frozen=True)
class LoraRows:
    by_count: dict[int, Groups]  # row count -> each adapter and its rows at that count
    uniform: LoraAdapter | None = None  # every row is this adapter's, whatever the count

    def groups(self, rows: int) -> Groups:
        if self.uniform is not None:
            return [(self.uniform, slice(0, rows))]
        groups = self.by_count.get(rows)
        if groups is not None:
            return groups
        tokens = max(self.by_count)
        if rows > tokens:  # the step padded to a bucket size: the padding rows are no one's
            return self.by_count[tokens]
        raise RuntimeError(f"LoRA: a projection over {rows} rows in a step of {sorted(self.by_count)} rows")

    def touches(self, key: str) -> bool:
        """Some adapter of this step updates projection `key`."""
        adapters = (
            [self.uniform] if self.uniform is not None else [a for g in self.by_count.values() for a, _ in g]
        )
        return any(key in a.weights for a in adapters)


_ACTIVE: ContextVar[LoraRows | None] = ContextVar("embedserve_lora_rows", default=None)


def active() -> LoraRows | None:
    return _ACTIVE.get()


@contextlib.contextmanager
def running(rows: LoraRows | None) -> Iterator[None]:
    """`rows` are the adapters' rows of the forward pass run inside (None: the base model's only)."""
    if rows is None:
        yield
        return
    token = _ACTIVE.set(rows)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def add_updates(key: str, x: torch.Tensor, y: torch.Tensor, cols: slice = _ALL) -> None:
    """y (projection `key` of x, maybe with padding rows after x's) += each adapter's update on
    its rows, for output columns `cols` of the projection."""
    rows = _ACTIVE.get()
    if rows is None or x.dim() != 2:
        return
    for adapter, where in rows.groups(x.shape[0]):
        w = adapter.weights.get(key)
        if w is None:
            continue
        if isinstance(where, slice):
            w.add_to(y[where], x[where], cols)
        else:
            y.index_add_(0, where, w.update(x.index_select(0, where), cols).to(y.dtype))


def uniform(adapter: LoraAdapter | None) -> LoraRows | None:
    """Every row of the passes run under it is `adapter`'s (one prompt: the layer-major lane)."""
    return None if adapter is None else LoraRows({}, adapter)


def step_rows(parts: Sequence[tuple[LoraAdapter | None, int, int]], device: torch.device) -> LoraRows | None:
    """A step's rows from its chunks in order: (adapter, tokens, rows pooling reads) each; None
    when no chunk uses an adapter."""
    if all(adapter is None for adapter, _, _ in parts):
        return None
    tokens = _groups([(a, n) for a, n, _ in parts], device)
    pooled = _groups([(a, k) for a, _, k in parts], device)
    total = sum(n for _, n, _ in parts)
    return LoraRows({sum(k for _, _, k in parts): pooled, total: tokens})


def _groups(spans: Sequence[tuple[LoraAdapter | None, int]], device: torch.device) -> Groups:
    """Each adapter's rows: one slice where they are contiguous, else an index tensor."""
    ranges: dict[int, tuple[LoraAdapter, list[tuple[int, int]]]] = {}
    start = 0
    for adapter, n in spans:
        if adapter is not None and n:
            ranges.setdefault(id(adapter), (adapter, []))[1].append((start, start + n))
        start += n
    out: Groups = []
    for adapter, spans_of in ranges.values():
        merged: list[tuple[int, int]] = []
        for lo, hi in spans_of:
            if merged and merged[-1][1] == lo:
                merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        if len(merged) == 1:
            out.append((adapter, slice(*merged[0])))
        else:
            index = torch.cat([torch.arange(lo, hi) for lo, hi in merged]).to(device)
            out.append((adapter, index))
    return out
