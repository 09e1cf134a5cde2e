"""The scheduler -> model runner contract: the only link between policy and tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

from embedserve.kv_cache.manager import Copy
from embedserve.lora.adapter import LoraAdapter
from embedserve.vision.state import MultimodalState


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
    token_type_ids: list[int] | None = None  # a pair's segment ids (encoders); None: all 0
    # The request's images (positions, encoder cache the runner fills); None: text only.
    multimodal: MultimodalState | None = None
    # An encoder's sequence whose positions from `attend_keys` on are queries only, never keys
    # (ColBERT's query expansion with attend false: models/multivector.py); None: all are keys.
    attend_keys: int | None = None
    adapter: LoraAdapter | None = None  # the LoRA adapter its rows run (lora/rows.py)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class LaneSlice:
    """The layer-major lane's part of a step: `token_layers` of work on one prompt (one token
    through one layer each), or, when `timed`, one unit sized to take about as long as an
    online step (the scheduler's measure, taken after this step's chunks ran)."""

    request_id: int
    token_layers: int
    timed: bool = False


@dataclass(frozen=True)
class SchedulerOutput:
    step: int
    chunks: list[ScheduledChunk]
    preempted_ids: list[int] = field(default_factory=list)
    lane: LaneSlice | None = None  # run after the chunks (and after answering what they finish)
    online: bool = False  # online work waited at this step (its time sizes the lane's units)
    # KV rows to copy before the forward pass: pinned prompt tails into the blocks of the
    # requests that start with them (kv_cache/manager.py).
    copies: list[Copy] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks and self.lane is None
