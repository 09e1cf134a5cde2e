"""CPU attention of many short sequences of one shape at once (attention/cpu.py's step path):
one SDPA call per group over [B, heads, L, d] instead of one call (and one K/V gather) per
sequence and layer. A step of 32 short queries makes 28 calls per model instead of 896."""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from embedserve.attention.metadata import AttentionMetadata, SeqSpan

# A whole sequence shorter than this (a first chunk: its keys are its queries), e.g. a short
# query, is one SDPA call: the tiled routes loop over KV heads or pack each head, which costs
# more than the math at that size. Short chunks after cached context of fewer keys than this
# are grouped too.
SDPA_WHOLE_BELOW = 64


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    # Bottom-right aligned: query i sits at position kv_len - q_len + i.
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    return k_pos <= q_pos  # [q_len, kv_len]


def short_whole_together(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
) -> set[int]:
    """Whole sequences (no cached context) under SDPA_WHOLE_BELOW tokens, each one SDPA
    call of its own (`cpu_route`), as one SDPA call per length over [B, heads, L, d]: a step
    of 32 queries makes 28 calls per model instead of 896. Every row sees the same keys
    through the same kernel blocking as alone, so the vectors are the same bits. Writes
    their rows of `out`; returns their q_start."""
    by_length: dict[int, list[int]] = {}
    for s in meta.seqs:
        if s.kv_slots is None and s.q_len < SDPA_WHOLE_BELOW:
            by_length.setdefault(s.q_len, []).append(s.q_start)
    done: set[int] = set()
    for length, starts in by_length.items():
        if len(starts) < 2:
            continue
        rows = _rows(starts, length, q.device)
        qb, kb, vb = (_gather(x, rows, len(starts), length).transpose(1, 2) for x in (q, k, v))
        o = scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=True)
        _scatter(out, rows, o)
        done.update(starts)
    return done


def short_cached_together(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, out: torch.Tensor
) -> set[int]:
    """Short chunks after cached context (a prefix-cache hit: a shared instruction, then the
    query), grouped by (queries, keys): one gather of their K/V from the cache and one masked
    SDPA call per group, instead of a gather and an attention call per sequence and layer.
    Writes their rows of `out`; returns their q_start."""
    groups: dict[tuple[int, int], list[SeqSpan]] = {}
    for s in meta.seqs:
        if s.kv_slots is not None and s.kv_slots.shape[0] < SDPA_WHOLE_BELOW:
            groups.setdefault((s.q_len, s.kv_slots.shape[0]), []).append(s)
    done: set[int] = set()
    for (length, kv), seqs in groups.items():
        if len(seqs) < 2:
            continue
        b = len(seqs)
        slots = torch.cat([s.kv_slots for s in seqs if s.kv_slots is not None])
        kb, vb = (
            kv_cache[i].index_select(0, slots).view(b, kv, *kv_cache.shape[2:]).transpose(1, 2)
            for i in (0, 1)
        )
        rows = _rows([s.q_start for s in seqs], length, q.device)
        qb = _gather(q, rows, b, length).transpose(1, 2)
        mask = causal_mask(length, kv, q.device)
        o = scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
        _scatter(out, rows, o)
        done.update(s.q_start for s in seqs)
    return done


def _rows(starts: list[int], length: int, device: torch.device) -> slice | torch.Tensor:
    """The packed rows of sequences of `length` starting at `starts`: a slice when they are
    one run (views, no gather)."""
    lo, b = starts[0], len(starts)
    if starts == list(range(lo, lo + b * length, length)):
        return slice(lo, lo + b * length)
    return (torch.tensor(starts)[:, None] + torch.arange(length)[None, :]).flatten().to(device)


def _gather(x: torch.Tensor, rows: slice | torch.Tensor, b: int, length: int) -> torch.Tensor:
    """[b, length, heads, d] of packed rows [T, heads, d]."""
    picked = x[rows] if isinstance(rows, slice) else x.index_select(0, rows)
    return picked.view(b, length, *x.shape[1:])


def _scatter(out: torch.Tensor, rows: slice | torch.Tensor, o: torch.Tensor) -> None:
    """SDPA's [b, heads, length, d] back into the packed rows of `out`."""
    flat = o.transpose(1, 2).reshape(-1, out.shape[1])
    if isinstance(rows, slice):
        out[rows] = flat
    else:
        out.index_copy_(0, rows, flat)
