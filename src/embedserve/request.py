"""A request's state machine: WAITING -> RUNNING -> FINISHED, with preemption back to WAITING.

One invariant drives everything: `num_computed_tokens` catches up to `num_prompt_tokens`.
Chunking and preemption (recompute) are the two ways that happens.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedserve.config import PoolingMethod
from embedserve.pooling.chunks import LateChunks
from embedserve.pooling.spans import SpanPoolingState
from embedserve.pooling.state import PoolingState
from embedserve.vision.state import MultimodalState

if TYPE_CHECKING:
    from embedserve.lora.adapter import LoraAdapter
    from embedserve.models.sparse_head import SparseHead
    from embedserve.pooling.dense import DenseHead


class Priority(str, enum.Enum):
    ONLINE = "online"
    BATCH = "batch"

    @classmethod
    def parse(cls, value: str | Priority) -> Priority:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown priority {value!r}; choose 'online' or 'batch'") from None


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class EmbedParams:
    """What to do with the pooled vector."""

    dimensions: int | None = None
    normalize: bool = True
    dense: DenseHead | None = None  # sentence-transformers Dense modules, before the two above


class Request:
    def __init__(
        self,
        request_id: int,
        token_ids: list[int],
        params: EmbedParams,
        pooling: PoolingMethod,
        priority: Priority = Priority.ONLINE,
        excluded_prefix: int = 0,
        token_type_ids: list[int] | None = None,
        deterministic_chunk: int | None = None,
        multimodal: MultimodalState | None = None,
        sparse_head: SparseHead | None = None,
        late: LateChunks | None = None,
        attend_keys: int | None = None,
        adapter: LoraAdapter | None = None,
        state: PoolingState | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids = token_ids
        # Segment ids of a (query, document) pair for encoders with token types; None: all 0.
        self.token_type_ids = token_type_ids
        # An encoder's positions from `attend_keys` on are queries only (scheduler/output.py).
        self.attend_keys = attend_keys
        self.params = params
        self.adapter = adapter  # the LoRA adapter its rows run (lora/); None: the base model
        # Images: their positions computed at admission, kept across preemption; an encoder
        # cache of its own (a Tokenized submitted twice shares the positions, not the cache).
        self.mm = None if multimodal is None else multimodal.fresh()
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.num_steps = 0  # steps that ran a chunk of it; lane slices that ran it (tracing reads them)
        self.num_lane_slices = 0
        # How its rows fold into its answer: `state` where the caller chose one (a multi-vector
        # or lexical request's); late chunking: one vector per chunk span (pooling/spans.py).
        if state is None:
            state = (
                PoolingState(pooling, len(token_ids), excluded_prefix, deterministic_chunk, sparse_head)
                if late is None
                else SpanPoolingState(late, len(token_ids), deterministic_chunk)
            )
        self.pooling = state
        # The hash chain of its full blocks (kv_cache/manager.py), set by a scheduler that caches
        # prefixes; None: it neither looks up nor registers blocks.
        self.block_hashes: list[bytes] | None = None
        # Its first `pin_prefix` tokens are a prompt the engine keeps cached for good (0: none).
        self.pin_prefix = 0
        # Set by the scheduler on admission; orders requests for scheduling and preemption.
        self.arrival_seq = -1
        self.arrival_step = -1
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def cache_root(self) -> bytes:
        """Where its prefix-cache keys start: its adapter's (none is shared across weights)."""
        return b"" if self.adapter is None else self.adapter.cache_root

    @property
    def num_remaining_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_computed_tokens

    @property
    def is_prefill_complete(self) -> bool:
        return self.num_computed_tokens == self.num_prompt_tokens

    def preempt(self) -> None:
        """Back to WAITING with nothing computed; the caller frees the KV blocks."""
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.pooling.reset()
        if self.mm is not None:
            self.mm.release()  # the tower re-runs with the recompute
        self.num_preemptions += 1

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, {self.status.value}, {self.priority.value}, "
            f"{self.num_computed_tokens}/{self.num_prompt_tokens})"
        )
