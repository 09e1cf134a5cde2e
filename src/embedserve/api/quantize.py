"""Compressed embedding types: float32 -> int8 / uint8 / binary / ubinary.

The arithmetic is sentence-transformers' `quantize_embeddings`, reproduced bit for bit:

    int8 / uint8   per dimension j: step_j = (max_j - min_j) / 255 (0 -> 1)
                   q = clip(floor((x - min_j) / step_j), 0, 255)      uint8: q,  int8: q - 128
    ubinary        np.packbits(x > 0): 8 dimensions per byte, the first one in the high bit
    binary         ubinary - 128 as int8 (Cohere's and sentence-transformers' signed form)

int8 / uint8 need per-dimension ranges. A server cannot take them from the request's own
vectors (one vector has no range, and the answer would depend on its batch), so it uses a
`Calibration` fixed at start-up: ranges read from a file (`--int8-calibration`: a `.npy`
array, either the [2, dim] ranges or [n, dim] calibration embeddings whose per-dimension
min / max become the ranges), or a fixed symmetric range [-scale, scale] in every dimension
(`--int8-scale`, default 1.0: right for any L2-normalized vector, coarse for long ones).
The calibration's key enters the embedding schema, so vectors quantized differently never
share an index.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = get_args(EmbeddingType)
DEFAULT_INT8_SCALE = 1.0


@dataclass(frozen=True)
class Calibration:
    """Per-dimension [min, max] ranges for int8 / uint8 (or one fixed symmetric range)."""

    ranges: np.ndarray | None  # float32 [2, dim]; None: [-scale, scale] at every width
    scale: float = DEFAULT_INT8_SCALE

    @classmethod
    def fixed(cls, scale: float = DEFAULT_INT8_SCALE) -> Calibration:
        if not scale > 0:
            raise ValueError(f"int8 scale must be > 0, got {scale}")
        return cls(None, float(scale))

    @classmethod
    def from_embeddings(cls, embeddings: np.ndarray) -> Calibration:
        e = np.asarray(embeddings, dtype=np.float32)
        if e.ndim != 2 or e.shape[0] < 2:
            raise ValueError("calibration embeddings must be [n >= 2, dim]")
        return cls(np.vstack((e.min(axis=0), e.max(axis=0))).astype(np.float32))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """A `.npy` file: [2, dim] ranges (min row, max row) or [n, dim] calibration vectors."""
        arr = np.load(Path(path), allow_pickle=False)
        if arr.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D array, got shape {arr.shape}")
        if arr.shape[0] == 2 and bool(np.all(arr[0] <= arr[1])):
            return cls(arr.astype(np.float32))
        return cls.from_embeddings(arr)

    def ranges_for(self, dim: int) -> np.ndarray:
        if self.ranges is None:
            return np.vstack((np.full(dim, -self.scale), np.full(dim, self.scale))).astype(np.float32)
        if self.ranges.shape[1] != dim:
            raise ValueError(
                f"the int8 calibration covers {self.ranges.shape[1]} dimensions, the vectors have {dim}"
            )
        return self.ranges

    def key(self) -> str:
        """Stable identity of the quantization (enters the embedding schema)."""
        if self.ranges is None:
            return f"fixed:{self.scale!r}"
        digest = hashlib.sha256(np.ascontiguousarray(self.ranges, dtype="<f4").tobytes()).hexdigest()
        return f"ranges:{digest[:16]}"


def quantize(vectors: np.ndarray, kind: str, calibration: Calibration | None = None) -> np.ndarray:
    """float32 [n, dim] -> the compressed type (numpy dtype as sentence-transformers returns)."""
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected [n, dim] vectors, got shape {x.shape}")
    if kind == "float":
        return x
    if kind in ("int8", "uint8"):
        ranges = (calibration or Calibration.fixed()).ranges_for(x.shape[1])
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        q = np.clip(np.floor((x - starts) / steps), 0, 255)
        return q.astype(np.uint8) if kind == "uint8" else (q - 128).astype(np.int8)
    if kind == "ubinary":
        return np.packbits(x > 0, axis=-1)
    if kind == "binary":
        return (np.packbits(x > 0, axis=-1) - 128).astype(np.int8)
    raise ValueError(f"unknown embedding type {kind!r}; choose one of {', '.join(EMBEDDING_TYPES)}")


def packed_dim(kind: str, dim: int) -> int:
    """Values per vector of that type (binary types hold 8 dimensions per byte)."""
    return (dim + 7) // 8 if kind.endswith("binary") else dim


def to_base64(vector: np.ndarray) -> str:
    """Raw little-endian bytes of one vector (float32, or one byte per value)."""
    arr = vector.astype("<f4") if vector.dtype.kind == "f" else vector
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def encode_values(values: np.ndarray, encoding_format: str) -> Any:
    """A vector or a [vectors, dim] matrix of any type for `encoding_format`: JSON numbers
    (a compressed type's integers); base64 of little-endian float32 whatever the type (what
    the openai client decodes; integers are exact in float32); base64_bytes, of the values' own
    bytes (one per int8 / uint8 value, one per 8 binary bits)."""
    if encoding_format == "base64":
        return to_base64(values.astype("<f4", copy=False))
    if encoding_format == "base64_bytes":
        return to_base64(values)
    return values.tolist()


def schema_type(kind: str, calibration: Calibration | None) -> str:
    """The embedding type as the schema records it: int8 / uint8 with their calibration key."""
    if kind in ("int8", "uint8"):
        return f"{kind}@{(calibration or Calibration.fixed()).key()}"
    return kind
