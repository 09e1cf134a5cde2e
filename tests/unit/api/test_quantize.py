"""Compressed embedding types match sentence-transformers' quantize_embeddings bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sentence_transformers.util import quantize_embeddings

from embedserve.api.quantize import Calibration, packed_dim, quantize, schema_type, to_base64


@pytest.fixture()
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    v = rng.standard_normal((50, 67)).astype(np.float32)  # 67: a partial last byte
    v[3, :5] = 0.0  # exact zeros are "not > 0"
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["binary", "ubinary"])
def test_binary_types_are_bit_identical(vectors: np.ndarray, kind: str) -> None:
    ours = quantize(vectors, kind)
    ref = quantize_embeddings(vectors, kind)
    assert ours.dtype == ref.dtype and ours.shape == (50, packed_dim(kind, 67))
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_int8_types_with_given_ranges(vectors: np.ndarray, kind: str) -> None:
    cal = Calibration.from_embeddings(vectors[:30])
    ours = quantize(vectors, kind, cal)
    ref = quantize_embeddings(vectors, kind, calibration_embeddings=vectors[:30])
    assert ours.dtype == ref.dtype and np.array_equal(ours, ref)
    fixed = quantize(vectors, kind, Calibration.fixed(0.5))
    ranges = np.vstack((np.full(67, -0.5), np.full(67, 0.5))).astype(np.float32)
    assert np.array_equal(fixed, quantize_embeddings(vectors, kind, ranges=ranges))


def test_calibration_file_holds_ranges_or_embeddings(vectors: np.ndarray, tmp_path: Path) -> None:
    ranges = np.vstack((vectors.min(0), vectors.max(0)))
    np.save(tmp_path / "r.npy", ranges)
    np.save(tmp_path / "e.npy", vectors)
    a, b = Calibration.load(tmp_path / "r.npy"), Calibration.load(tmp_path / "e.npy")
    assert a.key() == b.key() and a.key().startswith("ranges:")
    assert schema_type("int8", a) != schema_type("int8", Calibration.fixed())
    assert schema_type("binary", a) == "binary"
    with pytest.raises(ValueError, match="covers 67 dimensions"):
        a.ranges_for(32)


def test_base64_is_raw_bytes(vectors: np.ndarray) -> None:
    import base64

    q = quantize(vectors[:1], "int8")[0]
    assert np.array_equal(np.frombuffer(base64.b64decode(to_base64(q)), dtype=np.int8), q)
    f = np.frombuffer(base64.b64decode(to_base64(vectors[0])), dtype="<f4")
    assert np.array_equal(f, vectors[0])
