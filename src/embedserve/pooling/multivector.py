"""Token-wise pooling for multi-vector models: each kept position's row, projected by the
model's token head (models/multivector.py), written into the request's [vectors, dim] buffer as
its chunk finishes. The [positions, hidden] rows are never kept.

PoolingState's contract holds: positions in order, each pooled once, a partial result refused;
a preempted request starts over with a fresh buffer. In deterministic mode rows are projected
in the same blocks of prompt positions however the prompt was chunked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from embedserve.config import PoolingMethod
from embedserve.errors import InternalEngineError
from embedserve.pooling.state import PoolingState

if TYPE_CHECKING:
    from embedserve.models.multivector import MultiVectorHead


class MultiVectorState(PoolingState):
    def __init__(
        self,
        head: MultiVectorHead,
        keep: list[bool],
        deterministic_chunk: int | None = None,
        dimensions: int | None = None,
        normalize: bool = False,
    ) -> None:
        if not any(keep):
            raise InternalEngineError("a multi-vector request without a position that gives a vector")
        self.head = head
        self.dimensions, self.normalize = dimensions, normalize
        self.keep = torch.tensor(keep, dtype=torch.bool)
        # The output row of each kept position (cumulative count), so a chunk writes in place.
        self._slot = torch.cumsum(self.keep.long(), 0) - 1
        self.num_vectors = int(self.keep.sum())
        first = int(torch.nonzero(self.keep)[0])
        super().__init__(PoolingMethod.MEAN, len(keep), first, deterministic_chunk)

    def reset(self) -> None:
        super().reset()
        self._out: torch.Tensor | None = None
        self._written = 0

    def update(self, start: int, n: int, rows: torch.Tensor) -> None:
        first = start + self._check(start, n, rows)
        if self._out is None:
            self._out = torch.empty(self.num_vectors, self.head.dim, dtype=torch.float32)
        for part in self._blocks(first, rows):
            keep = self.keep[first : first + part.shape[0]]
            if bool(keep.any()):
                slots = self._slot[first : first + part.shape[0]][keep]
                self._out[slots] = self.head.project(part[keep])
                self._written += int(keep.sum())
            first += part.shape[0]
        self.num_rows += rows.shape[0]
        self.num_pooled_tokens = start + n

    def finish(self) -> torch.Tensor:
        """[vectors, dim] float32: sliced to `dimensions`, then each vector normalized if asked."""
        if self.num_pooled_tokens != self.num_prompt_tokens or self._written != self.num_vectors:
            raise InternalEngineError(
                f"pooled {self.num_pooled_tokens} of {self.num_prompt_tokens} tokens, "
                f"{self._written} of {self.num_vectors} vectors; refusing to return partial vectors"
            )
        assert self._out is not None
        out = self._out if self.dimensions is None else self._out[:, : self.dimensions]
        return torch.nn.functional.normalize(out, p=2.0, dim=-1) if self.normalize else out
