"""The scheduler -> model runner contract: the only link between policy and tensors."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScheduledChunk:
    """Prompt positions [start, start + len(token_ids)) of one request.

    `start` is also the number of this request's tokens already in the KV cache: the chunk's
    query i sits at position start + i and attends keys 0 .. start + i.
    """

    request_id: int
    start: int
    token_ids: list[int]
    block_table: list[int]
    # Local rows [lo, hi) of this chunk that pooling reads (see pooling/methods.py).
    pool_rows: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    step: int
    chunks: list[ScheduledChunk]
    preempted_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks
