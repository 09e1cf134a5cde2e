"""PoolingState: accumulates across chunks, never loses or double-counts a chunk."""

from __future__ import annotations

import pytest
import torch

from embedserve.config import PoolingMethod
from embedserve.errors import InternalEngineError
from embedserve.pooling.head import apply_head
from embedserve.pooling.state import PoolingState


def _feed(state: PoolingState, hidden: torch.Tensor, chunk: int) -> None:
    for start in range(0, hidden.shape[0], chunk):
        n = min(chunk, hidden.shape[0] - start)
        lo, hi = state.rows(start, n)
        state.update(start, n, hidden[start + lo : start + hi])


@pytest.mark.parametrize("chunk", [1, 3, 7, 10])
def test_methods_match_whole_sequence_pooling(chunk: int) -> None:
    hidden = torch.randn(10, 4)
    expected = {
        PoolingMethod.LAST: hidden[-1],
        PoolingMethod.MEAN: hidden.mean(0),
        PoolingMethod.CLS: hidden[0],
    }
    for method, want in expected.items():
        state = PoolingState(method, 10)
        _feed(state, hidden, chunk)
        torch.testing.assert_close(state.finish(), want)


def test_mean_without_prompt_skips_prompt_positions() -> None:
    hidden = torch.randn(9, 3)
    state = PoolingState(PoolingMethod.MEAN, 9, excluded_prefix=4)
    _feed(state, hidden, 2)
    torch.testing.assert_close(state.finish(), hidden[4:].mean(0))


def test_gap_and_double_count_are_refused() -> None:
    state = PoolingState(PoolingMethod.MEAN, 6)
    state.update(0, 3, torch.ones(3, 2))
    with pytest.raises(InternalEngineError, match="expected a chunk at position 3"):
        state.update(4, 2, torch.ones(2, 2))  # gap: position 3 lost
    with pytest.raises(InternalEngineError, match="expected a chunk at position 3"):
        state.update(0, 3, torch.ones(3, 2))  # the first chunk again
    with pytest.raises(InternalEngineError, match="runs past the prompt"):
        state.update(3, 4, torch.ones(4, 2))


def test_partial_state_never_finishes() -> None:
    state = PoolingState(PoolingMethod.LAST, 5)
    state.update(0, 4, torch.ones(0, 2))
    with pytest.raises(InternalEngineError, match="pooled 4 of 5"):
        state.finish()


def test_reset_forgets_progress() -> None:
    state = PoolingState(PoolingMethod.MEAN, 4)
    state.update(0, 2, torch.ones(2, 2))
    state.reset()
    state.update(0, 4, torch.full((4, 2), 3.0))
    torch.testing.assert_close(state.finish(), torch.full((2,), 3.0))


def test_head_slices_before_normalizing() -> None:
    v = torch.tensor([3.0, 4.0, 100.0])
    torch.testing.assert_close(apply_head(v, 2, True), torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(apply_head(v, None, False), v)
