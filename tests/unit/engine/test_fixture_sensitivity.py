"""The tiny fixtures are sensitive: deliberately wrong engines fall clearly below the bar.

Random weights at the default 0.02 scale give near-uniform attention, which would hide wrong
RoPE offsets or chunk boundaries. These tests keep the fixtures honest: if they stop failing
the wrong variants, the parity tests above them prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.attention.metadata import SeqSpan
from embedserve.worker import input_batch
from tests.helpers.reference import cosine, hf_embed_ids, random_ids

SEQS = [random_ids(n, seed=n) for n in (300, 1000)]


@pytest.fixture(scope="module")
def reference(qwen3_dir: Path) -> np.ndarray:
    return hf_embed_ids(qwen3_dir, SEQS)


def _embed(path: Path) -> np.ndarray:
    with Engine.from_pretrained(path, max_num_batched_tokens=64) as engine:
        return engine.embed(SEQS)


def test_correct_engine_passes(qwen3_dir: Path, reference: np.ndarray) -> None:
    assert cosine(_embed(qwen3_dir), reference).min() >= 0.99999


def test_positions_restarting_at_each_chunk_fail(
    qwen3_dir: Path, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = input_batch.chunk_positions
    monkeypatch.setattr(input_batch, "chunk_positions", lambda start, n: real(0, n))
    assert cosine(_embed(qwen3_dir), reference).max() < 0.99


def test_chunk_blind_to_earlier_chunks_fails(
    qwen3_dir: Path, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    def blind(q_start: int, n: int, *_: object) -> SeqSpan:
        return SeqSpan(q_start=q_start, q_len=n, start=0, kv_slots=None)

    monkeypatch.setattr(input_batch, "seq_span", blind)
    assert cosine(_embed(qwen3_dir), reference).max() < 0.99
