"""Packed step inputs built from a SchedulerOutput (host-side work, vectorized with numpy).

chunk A (start=0, n=3)   chunk B (start=16, n=2)
rows:      0 1 2               3 4
positions: 0 1 2              16 17
slots:     table_A[p // bs] * bs + p % bs  for each position p
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embedserve.attention.metadata import AttentionMetadata, SeqSpan, pieces, seq_span, slots
from embedserve.scheduler.output import SchedulerOutput


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    output_rows: torch.Tensor  # [R] packed rows that pooling reads
    # request_id -> (offset, count) into the model output's R rows
    pooled: dict[int, tuple[int, int]]
    token_type_ids: torch.Tensor | None = None  # [T]; None: every token is segment 0


def chunk_positions(start: int, n: int) -> np.ndarray:
    """Prompt positions of a chunk: they continue where the cached context ends."""
    return np.arange(start, start + n, dtype=np.int64)


def build_step_inputs(
    out: SchedulerOutput,
    block_size: int,
    device: torch.device,
    causal: bool = True,
    use_cache: bool = True,
    deterministic_chunk: int | None = None,
) -> StepInputs:
    """`deterministic_chunk` (deterministic mode): each chunk attends as pieces cut at multiples of that many
    prompt positions, so a piece's attention call has the same shape however the request was
    chunked or batched."""
    ids: list[int] = []
    pos_parts: list[np.ndarray] = []
    slot_parts: list[np.ndarray] = []
    seqs: list[SeqSpan] = []
    rows: list[np.ndarray] = []
    pooled: dict[int, tuple[int, int]] = {}
    q_start = 0
    n_rows = 0
    for c in out.chunks:
        n = c.num_tokens
        ids.extend(c.token_ids)
        pos = chunk_positions(c.start, n)
        pos_parts.append(pos)
        if use_cache:
            slot_parts.append(
                slots(c.block_table, np.arange(c.start, c.start + n, dtype=np.int64), block_size)
            )
            seqs += [
                seq_span(q_start + p0 - c.start, m, p0, c.block_table, block_size, device)
                for p0, m in pieces(c.start, n, deterministic_chunk)
            ]
        else:
            seqs.append(SeqSpan(q_start=q_start, q_len=n, start=0, kv_slots=None, keys=c.attend_keys))
        lo, hi = c.pool_rows
        rows.append(np.arange(q_start + lo, q_start + hi, dtype=np.int64))
        pooled[c.request_id] = (n_rows, hi - lo)
        n_rows += hi - lo
        q_start += n
    slot_mapping = torch.from_numpy(np.concatenate(slot_parts)).to(device) if use_cache else None
    types = None
    if any(c.token_type_ids is not None for c in out.chunks):
        types = torch.tensor(
            [t for c in out.chunks for t in (c.token_type_ids or [0] * c.num_tokens)],
            dtype=torch.long,
            device=device,
        )
    return StepInputs(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.from_numpy(np.concatenate(pos_parts)).to(device),
        meta=AttentionMetadata(
            seqs=seqs, slot_mapping=slot_mapping, causal=causal, deterministic=deterministic_chunk is not None
        ),
        output_rows=torch.from_numpy(np.concatenate(rows)).to(device),
        pooled=pooled,
        token_type_ids=types,
    )
