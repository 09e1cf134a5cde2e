"""How many lines an online batch keeps in flight on a server (`--batch-share`): about `share` of
the engine's per-step token budget, from the tokens its recent lines held. The batch's requests
then never fill more than that share of a step on their own, and while online requests wait the
scheduler gives batch work at most its `batch_tokens_with_online` of each step (scheduler.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

from embedserve.batch.format import Result

_WEIGHT = 0.1  # of each answered line in the tokens-per-line average


class TokenShare:
    def __init__(self, budget: Callable[[], int], share: float, most: int = 64) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"batch share must be in (0, 1], got {share}")
        self.budget = budget  # the engine's max_num_batched_tokens (known once it is loaded)
        self.share = share
        self.most = most
        self.tokens_per_line: float | None = None

    def add(self, result: Result) -> None:
        tokens = result.tokens
        if tokens:
            prev = self.tokens_per_line
            self.tokens_per_line = tokens if prev is None else (1 - _WEIGHT) * prev + _WEIGHT * tokens

    def __call__(self) -> int:
        if self.tokens_per_line is None:
            return 1  # the first line tells how long lines are
        lines = math.floor(self.share * self.budget() / self.tokens_per_line)
        return max(1, min(self.most, lines))
