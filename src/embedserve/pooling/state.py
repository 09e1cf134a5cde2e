"""Per-request pooling state: accumulates across chunks, idempotent by position."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from embedserve.config import PoolingMethod
from embedserve.errors import InternalEngineError
from embedserve.pooling.methods import finalize, fold, rows_to_pool, unread_prefix

if TYPE_CHECKING:
    from embedserve.models.lexical_head import LexicalHead
    from embedserve.models.sparse_head import SparseHead


class PoolingState:
    """Accumulates one request's pooled vector chunk by chunk.

    It records `num_pooled_tokens` and accepts a chunk only if it starts exactly there, so a
    lost or double-counted chunk raises instead of producing a plausible wrong vector.
    """

    def __init__(
        self,
        method: PoolingMethod,
        num_prompt_tokens: int,
        excluded_prefix: int = 0,
        deterministic_chunk: int | None = None,
        sparse_head: SparseHead | LexicalHead | None = None,
        token_ids: list[int] | None = None,
    ) -> None:
        if (method is PoolingMethod.SPLADE) != (sparse_head is not None):
            raise InternalEngineError("SPLADE pooling needs the model's sparse head, and only it uses one")
        self.method = method
        # SPLADE: each block of rows becomes term weights [vocab] (max or sum over its tokens)
        # and folds into the accumulator the same way; rows are never kept.
        self.sparse_head = sparse_head
        # BGE-M3's lexical head weighs each row by its token id (models/lexical_head.py).
        self.token_ids = None if token_ids is None else torch.tensor(token_ids, dtype=torch.long)
        self.num_prompt_tokens = num_prompt_tokens
        # MEAN pooling of a model with `include_prompt: false` leaves out the prompt's tokens.
        self.excluded_prefix = excluded_prefix
        # Deterministic mode: MEAN sums rows per block of prompt positions [k*B, (k+1)*B), block
        # after block, so the sum's rounding does not depend on how the prompt was chunked.
        self.deterministic_chunk = deterministic_chunk
        self.reset()

    def reset(self) -> None:
        self.num_pooled_tokens = 0
        self.num_rows = 0
        self._acc: torch.Tensor | None = None

    def rows(self, start: int, n: int) -> tuple[int, int]:
        """Local row range the runner must hand over for chunk [start, start+n)."""
        return rows_to_pool(self.method, start, n, self.num_prompt_tokens, self.excluded_prefix)

    @property
    def skippable(self) -> int:
        """Leading positions this pooling never reads (what a prefix-cache hit may cover); none
        in deterministic mode (its MEAN blocks start at position 0)."""
        if self.deterministic_chunk is not None:
            return 0
        return unread_prefix(self.method, self.num_prompt_tokens, self.excluded_prefix)

    def skip(self, n: int) -> None:
        """Positions [0, n) computed elsewhere (cached K/V): pooled, with no rows to fold."""
        if self.num_pooled_tokens != 0 or n > self.skippable:
            raise InternalEngineError(
                f"cannot skip {n} positions: {self.num_pooled_tokens} pooled, {self.skippable} skippable"
            )
        self.num_pooled_tokens = n

    def update(self, start: int, n: int, rows: torch.Tensor) -> None:
        """Fold chunk [start, start+n); `rows` are its selected rows, [k, hidden]."""
        lo = self._check(start, n, rows)
        head = self.sparse_head
        first = start + lo
        for part in self._blocks(first, rows):
            if head is None:
                self._acc = fold(self.method, self._acc, part)
            elif part.shape[0]:
                ids = None if self.token_ids is None else self.token_ids[first : first + part.shape[0]]
                weights = head.weights(part, ids)
                self._acc = weights if self._acc is None else head.combine(self._acc, weights)
            first += part.shape[0]
        self.num_rows += rows.shape[0]
        self.num_pooled_tokens = start + n

    def _check(self, start: int, n: int, rows: torch.Tensor) -> int:
        """Refuse a chunk that does not start where pooling stopped, runs past the prompt or
        brings another number of rows than `rows` asks for; the chunk's first row read."""
        if start != self.num_pooled_tokens:
            raise InternalEngineError(
                f"pooling expected a chunk at position {self.num_pooled_tokens}, got {start}"
            )
        if start + n > self.num_prompt_tokens:
            raise InternalEngineError(
                f"chunk [{start}, {start + n}) runs past the prompt ({self.num_prompt_tokens})"
            )
        lo, hi = self.rows(start, n)
        if rows.shape[0] != hi - lo:
            raise InternalEngineError(f"pooling expected {hi - lo} rows, got {rows.shape[0]}")
        return lo

    def _blocks(self, first: int, rows: torch.Tensor) -> list[torch.Tensor]:
        """`rows` (prompt positions first, first+1, ...) cut at multiples of `deterministic_chunk`."""
        b = self.deterministic_chunk
        if b is None or rows.shape[0] == 0:
            return [rows]
        cuts = [0, *range(b - first % b, rows.shape[0], b), rows.shape[0]]
        return [rows[lo:hi] for lo, hi in itertools.pairwise(cuts) if hi > lo]

    def finish(self) -> torch.Tensor:
        """The pooled float32 vector; refuses unless every prompt token was pooled once."""
        if self.num_pooled_tokens != self.num_prompt_tokens or self._acc is None:
            raise InternalEngineError(
                f"pooled {self.num_pooled_tokens} of {self.num_prompt_tokens} tokens; "
                "refusing to return a partial vector"
            )
        return finalize(self.method, self._acc, self.num_rows)
