"""Late chunking on the engine: a document runs as one ordinary request (same batching, token
budget, chunked prefill, preemption, layer-major lane), pooled per chunk span
(pooling/spans.py); a long one as overlapping windows joined after (tokenizer/windows.py). The
renderer plans the document (tokenizer/render_sides.py); here its windows are queued and joined.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from embedserve.engine.ask import Ask
from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.engine.outputs import EmbeddingOutput
from embedserve.pooling.chunks import ChunkSpan
from embedserve.pooling.head import apply_head
from embedserve.tokenizer.windows import LongPlan


@dataclass(frozen=True)
class LateChunkOutput:
    embeddings: np.ndarray  # float32 [chunks, dim], one row per entry of `chunks`
    chunks: tuple[ChunkSpan, ...]  # each row's chunk: its index, token and character ranges
    num_tokens: int  # of the whole document as the model read it
    truncated: bool  # the document was cut to max_model_len (cut-off chunks have no row)
    windows: int = 1  # requests it ran as (long documents: overlapping windows)
    overlap: int = 0  # content tokens consecutive windows shared


class LateChunkingMixin(EngineBase):
    """Late chunking: one vector per chunk of a document that ran whole (or as long windows)."""

    def _submit_late(self, plan: LongPlan, ask: Ask) -> list[Future[Finished]]:
        dimensions, normalize = ask.dimensions, ask.normalize
        self._check_dimensions(dimensions)  # the windows' rows are sliced after they are joined
        if plan.raw:  # each window's raw span rows; the head applies once they are joined
            dimensions, normalize = None, False
        return self._submit_tokenized(
            plan.windows, dimensions=dimensions, normalize=normalize, priority=ask.priority
        )

    def _late_output(self, plan: LongPlan, outputs: list[EmbeddingOutput], ask: Ask) -> LateChunkOutput:
        norm = self.config.pooling.normalize if ask.normalize is None else ask.normalize
        rows = [o.embedding for o in outputs]
        doc = plan.document
        return LateChunkOutput(
            join_windows(plan, rows, ask.dimensions, norm), plan.spans, len(doc.token_ids), doc.truncated,
            len(plan.windows), plan.overlap_tokens,
        )  # fmt: skip


def join_windows(
    plan: LongPlan, rows: list[np.ndarray], dimensions: int | None, normalize: bool
) -> np.ndarray:
    """The chunks' vectors from each window's answer rows: the one request's rows when the
    document ran whole, else the windows' raw rows joined, then the output head."""
    if not plan.raw:
        return rows[0]
    return apply_head(torch.from_numpy(plan.join(rows)), dimensions, normalize).numpy()
