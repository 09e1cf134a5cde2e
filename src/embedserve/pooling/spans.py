"""Late chunking's pooling: one document's prompt run once, one vector per chunk's token span.

    positions  0 1 2 3 4 5 6 7 8 9 10 11 12 13 14
    spans      [0 ..... 4) [4 ........ 9) [9 ......... 15)     (tokenizer/late.py assigns them)
    chunks     .... [3 ............ 8) [8 ............. 15)    (the scheduler's, anywhere)

Each span keeps its own float32 sum (MEAN) or its last row (LAST, for causal decoders): a
[spans, hidden] accumulator, never the [tokens, hidden] rows. A chunk's rows fold into every
span they overlap, so a chunk cut inside a span, preemption (reset, recompute) and the
layer-major lane (the same `update` calls) all give the same vectors. In deterministic mode a
span's rows are summed per fixed block of positions as MEAN pooling's are (pooling/state.py).
"""

from __future__ import annotations

import bisect

import torch

from embedserve.config import PoolingMethod
from embedserve.errors import InternalEngineError
from embedserve.pooling.chunks import LateChunks, SpanPooling
from embedserve.pooling.state import PoolingState


class SpanPoolingState(PoolingState):
    """PoolingState's contract (positions in order, each pooled once, refusal of anything
    else) with one vector per span: `finish()` returns [spans, hidden]."""

    def __init__(self, late: LateChunks, num_prompt_tokens: int, deterministic_chunk: int | None) -> None:
        self.late = late
        self.bounds = [s.tokens for s in late.spans]
        self._starts = [a for a, _ in self.bounds]
        if self.bounds[-1][1] > num_prompt_tokens:
            raise InternalEngineError(f"span {self.bounds[-1]} runs past the prompt ({num_prompt_tokens})")
        # Rows read: from the first span's start (LAST: its last row) to the last span's end, so
        # one span read LAST is exactly LAST pooling (the last layer finishes that row alone).
        last = late.pooling is SpanPooling.LAST
        self._read = (self.bounds[0][1] - 1 if last else self.bounds[0][0], self.bounds[-1][1])
        super().__init__(PoolingMethod.MEAN, num_prompt_tokens, self._read[0], deterministic_chunk)

    def reset(self) -> None:
        super().reset()
        self._counts = [0] * len(self.bounds)

    def rows(self, start: int, n: int) -> tuple[int, int]:
        """The chunk's rows between the first row read and the last span's end."""
        lo = max(self._read[0], start)
        hi = min(self._read[1], start + n)
        return (lo - start, hi - start) if lo < hi else (0, 0)

    @property
    def skippable(self) -> int:
        if self.deterministic_chunk is not None:
            return 0
        return min(self._read[0], self.num_prompt_tokens - 1)

    def update(self, start: int, n: int, rows: torch.Tensor) -> None:
        first = start + self._check(start, n, rows)
        end = first + rows.shape[0]
        i = max(bisect.bisect_right(self._starts, first) - 1, 0)
        while i < len(self.bounds) and self.bounds[i][0] < end:
            a, b = max(self.bounds[i][0], first), min(self.bounds[i][1], end)
            if a < b:
                self._fold_span(i, a, rows[a - first : b - first])
            i += 1
        self.num_rows += rows.shape[0]
        self.num_pooled_tokens = start + n

    def _fold_span(self, i: int, first: int, part: torch.Tensor) -> None:
        if self._acc is None:
            self._acc = torch.zeros(len(self.bounds), part.shape[1], dtype=torch.float32)
        if self.late.pooling is SpanPooling.LAST:
            if first + part.shape[0] == self.bounds[i][1]:
                self._acc[i] = part[-1].float()
                self._counts[i] += 1
            return
        for block in self._blocks(first, part):
            self._acc[i] += block.float().sum(dim=0)
        self._counts[i] += part.shape[0]

    def finish(self) -> torch.Tensor:
        """[spans, hidden] float32; refuses unless every position was pooled once and every
        span got each of its rows."""
        last = self.late.pooling is SpanPooling.LAST
        missing = [i for i, (a, b) in enumerate(self.bounds) if self._counts[i] != (1 if last else b - a)]
        if self.num_pooled_tokens != self.num_prompt_tokens or self._acc is None or missing:
            raise InternalEngineError(
                f"pooled {self.num_pooled_tokens} of {self.num_prompt_tokens} tokens, spans "
                f"{missing} incomplete; refusing to return partial vectors"
            )
        if last or self.late.pooling is SpanPooling.SUM:
            return self._acc
        counts = torch.tensor(self._counts, dtype=torch.float32)
        return self._acc / counts[:, None]
