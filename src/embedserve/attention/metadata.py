"""Per-step attention inputs: where each sequence sits in the packed batch and which cache
slots hold its context. Shared by every route; built by worker/input_batch.py (and by the
routes' self-check, which needs no scheduler).

Tokens of all scheduled requests are packed into one sequence (no padding). For a request
whose chunk starts at prompt position `start`:

    KV cache (its blocks)   |k0 k1 ... k_{start-1}|      <- written by earlier steps
    this step               |                     |q0 q1 ... q_{n-1}|  (also written now)
    query i (position start+i) attends keys 0 .. start+i   (causal, aligned bottom-right)

A first chunk (start == 0) needs no cache read: its own keys are all it may see. Steps padded
to a token bucket (worker/buckets.py) carry rows after the last sequence that belong to none.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SeqSpan:
    """One request's part of the packed batch."""

    q_start: int  # first row in the packed tensors
    q_len: int
    start: int  # prompt position of the first query == tokens already cached
    kv_slots: torch.Tensor | None  # [start + q_len] flat cache slots; None when start == 0
    keys: int | None = None  # an encoder's: only its first `keys` rows are keys (None: all)

    @property
    def kv_len(self) -> int:
        return self.start + self.q_len


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step attention inputs, passed explicitly through the model (no globals)."""

    seqs: list[SeqSpan]
    slot_mapping: torch.Tensor | None  # [num_tokens] flat slots to write new K/V; None: no cache
    causal: bool = True
    deterministic: bool = False  # attention bytes independent of the thread count (attention/cpu.py)


# (q [T, heads, d], k [T, kv_heads, d], v, kv_cache [2, slots, kv_heads, d] | None, meta, scale)
# -> [T, heads * d]. Every route has this contract; the model holds the one chosen for it.
AttentionFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, AttentionMetadata, float], torch.Tensor
]


def check_whole(kv_caches: list[torch.Tensor] | None, meta: AttentionMetadata) -> None:
    """A model that runs every input whole in one step (encoders, Gemma3) gets no cache and no
    cached context."""
    if kv_caches is not None or any(s.start for s in meta.seqs):
        raise ValueError("this model runs whole sequences without a KV cache")


def slots(table: list[int], positions: np.ndarray, block_size: int) -> np.ndarray:
    """Flat cache slots of prompt `positions` for a request with block table `table`."""
    blocks = np.asarray(table, dtype=np.int64)
    return blocks[positions // block_size] * block_size + positions % block_size


def seq_span(
    q_start: int, n: int, start: int, table: list[int], block_size: int, device: torch.device
) -> SeqSpan:
    """Where a chunk's queries sit and which cached keys (all earlier positions) they see."""
    kv_slots = None
    if start > 0:
        kv = slots(table, np.arange(start + n, dtype=np.int64), block_size)
        kv_slots = torch.from_numpy(kv).to(device)
    return SeqSpan(q_start=q_start, q_len=n, start=start, kv_slots=kv_slots)


def pieces(start: int, n: int, deterministic_chunk: int | None) -> list[tuple[int, int]]:
    """(start, length) of [start, start+n) cut at multiples of `deterministic_chunk` (None: one piece)."""
    if deterministic_chunk is None:
        return [(start, n)]
    step = deterministic_chunk
    cuts = [start, *range(start - start % step + step, start + n, step), start + n]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(cuts)]


def real_rows(meta: AttentionMetadata) -> int:
    """Packed rows that belong to a sequence; rows past them are bucket padding."""
    return max((s.q_start + s.q_len for s in meta.seqs), default=0)


def write_kv(
    kv_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int
) -> None:
    """Store the first n rows' K/V; padding rows (slot -1) never reach the cache."""
    kv_cache[0].index_copy_(0, slot_mapping[:n], k[:n])
    kv_cache[1].index_copy_(0, slot_mapping[:n], v[:n])
