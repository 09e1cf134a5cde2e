"""Feeding a backend: length-sorted batches within limits, input order restored, reference cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.parity.backends import Backend
from embedserve.parity.cache import VectorCache
from embedserve.parity.datasets import Item
from embedserve.parity.embedding import embed_side
from embedserve.parity.options import ParityError


class Recorder(Backend):
    """Vector = [length, first char]; records every batch it gets."""

    spec = "fake"

    def __init__(self, identity: str | None = None, dims: int = 2) -> None:
        self.batches: list[list[Item]] = []
        self.identity, self.dims = identity, dims
        self.batch_items, self.batch_tokens = 3, 100

    def cache_identity(self) -> str | None:
        return self.identity

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        self.batches.append(list(items))
        rows = [[len(prompt + str(i)), ord(str(i)[0])] + [0.0] * (self.dims - 2) for i in items]
        return np.asarray(rows, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def test_batches_follow_length_order_and_limits() -> None:
    items: list[Item] = ["a" * n for n in (40, 5, 30, 10, 20, 60, 1, 4, 4, 9)]
    backend = Recorder()
    vectors, timing = embed_side(backend, items, "", [len(str(i)) for i in items], 50, "t", False)
    np.testing.assert_array_equal(vectors[:, 0], [len(str(i)) for i in items])  # input order back
    sizes = [[len(str(i)) for i in b] for b in backend.batches]
    # <= 3 items, <= 100 padded tokens (60 counts as 50), longest <= 1.25 x shortest
    assert sizes == [[1], [4, 4, 5], [9, 10], [20], [30], [40, 60]]
    assert timing.tokens == 1 + 4 + 4 + 5 + 9 + 10 + 20 + 30 + 40 + 50


def test_reference_cache_round_trip(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path)
    items: list[Item] = ["xy", "z"]
    first = Recorder(identity="ref-v1")
    a, t1 = embed_side(first, items, "Q:", [2, 1], None, "t", False, cache)
    again = Recorder(identity="ref-v1")
    b, t2 = embed_side(again, items, "Q:", [2, 1], None, "t", False, cache)
    np.testing.assert_array_equal(a, b)
    assert again.batches == [] and (t1.cached, t2.cached) == (0, 2)
    # a different prompt, item, identity or an uncacheable backend is computed again
    for backend, prompt, data in (
        (Recorder("ref-v1"), "D:", items),
        (Recorder("ref-v1"), "Q:", ["xy", "w"]),
        (Recorder("ref-v2"), "Q:", items),
        (Recorder(None), "Q:", items),
    ):
        embed_side(backend, data, prompt, [2, 1], None, "t", False, cache)
        assert backend.batches, (backend.identity, prompt, data)
    assert len(list(tmp_path.glob("*.npy"))) == 4


def test_a_backend_changing_vector_size_is_refused() -> None:
    class Shifty(Recorder):
        def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
            self.dims += 1
            return super().embed(items, prompt)

    with pytest.raises(ParityError, match="vectors of different sizes"):
        embed_side(Shifty(), ["a", "bbbbbbbbbbbbbbb"] * 3, "", [1, 15] * 3, None, "t", False)
