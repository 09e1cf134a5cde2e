"""A running batch's request_counts (and tokens answered), saved to its record every few
seconds while its lines are answered (batch/online.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from embedserve.batch.format import Result
from embedserve.batch.store import Record

_SAVE_EVERY_S = 2.0  # a running batch's request_counts reach its record at most this late


class Counts:
    """A running batch's request_counts, saved to its record every few seconds."""

    def __init__(self, rec: Record, save: Callable[[Record], None], on_result: Callable[[Result], None]):
        self.rec = rec
        self.save = save
        self.on_result = on_result
        self._saved = time.monotonic()

    def add(self, result: Result) -> None:
        counts = self.rec["request_counts"]
        counts["completed" if result.ok else "failed"] += 1
        self.rec["_tokens"] = self.rec.get("_tokens", 0) + result.tokens
        self.on_result(result)
        if time.monotonic() - self._saved >= _SAVE_EVERY_S:
            self._saved = time.monotonic()
            self.save(self.rec)

    def close(self) -> None:
        self.save(self.rec)
