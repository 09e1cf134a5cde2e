"""`--embedding-type int8 | uint8 | binary | ubinary`: any embedder's float vectors, compressed
(api/quantize.py) before they are stored or searched, under their own embedding schema
(`schema.compressed_schema`: the same one the server reports for that type), so a compressed
index is never searched with float queries nor mixed with float vectors.

Milvus Lite (3.2) has no binary or int8 vector field, so the codes are stored in a float vector
field whose cosine ranks exactly as the compressed search does:

    int8 / uint8   the integer codes as floats                   cosine of the codes
    binary types   each bit as +1 / -1 (dimension 8 x bytes)     cosine = 1 - 2 x Hamming / dim
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from embedserve.api.quantize import Calibration, quantize, schema_type
from embedserve.index.embedder import Embedder, VectorMeta
from embedserve.index.store import Hit
from embedserve.schema import compressed_schema
from embedserve.tokenizer import Tokenizer


def stored_codes(vectors: np.ndarray, kind: str, calibration: Calibration) -> np.ndarray:
    """float32 [n, dim] -> the codes as float32 vectors for a float vector field."""
    q = quantize(vectors, kind, calibration)
    if kind.endswith("binary"):
        bits = np.unpackbits(q.view(np.uint8), axis=1)
        return (2.0 * bits.astype(np.float32) - 1.0).astype(np.float32)
    return q.astype(np.float32)


def decoded(codes: np.ndarray, kind: str, calibration: Calibration) -> np.ndarray:
    """Stored codes [n, d] -> approximate float vectors for rescoring with a float query: an
    int8 / uint8 code becomes the middle of its bucket; a binary code stays +1 / -1."""
    if kind.endswith("binary"):
        return codes.astype(np.float32)
    ranges = calibration.ranges_for(codes.shape[1])
    steps = (ranges[1] - ranges[0]) / 255
    levels = codes + (128.0 if kind == "int8" else 0.0)
    return (ranges[0] + (levels + 0.5) * np.where(steps == 0, 1, steps)).astype(np.float32)


class QuantizingEmbedder:
    """An Embedder whose vectors are another embedder's, compressed to `kind`."""

    def __init__(self, inner: Embedder, kind: str, calibration: Calibration) -> None:
        if kind == "float":
            raise ValueError("QuantizingEmbedder needs a compressed type")
        self.inner = inner
        self.kind = kind
        self.calibration = calibration
        if kind.endswith("int8"):
            calibration.ranges_for(inner.dimension)  # a calibration of another width: fail now
        schema = compressed_schema(inner.meta.embedding_schema, schema_type(kind, calibration))
        self.meta: VectorMeta = replace(inner.meta, embedding_schema=schema)
        self.dimension = 8 * ((inner.dimension + 7) // 8) if kind.endswith("binary") else inner.dimension
        self.tokenizer: Tokenizer | None = inner.tokenizer
        self.max_tokens: int | None = inner.max_tokens
        self.late = inner.late
        self.late_prompt_tokens = inner.late_prompt_tokens

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return stored_codes(self.inner.embed_documents(texts), self.kind, self.calibration)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return stored_codes(self.inner.embed_queries(texts), self.kind, self.calibration)

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        found = self.inner.embed_late_documents(windows)
        return [stored_codes(rows, self.kind, self.calibration) for rows in found]

    def rescore_queries(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(codes to search with, the float queries to rescore with)."""
        floats = self.inner.embed_queries(texts)
        return stored_codes(floats, self.kind, self.calibration), floats

    def rescored(self, hits: list[Hit], query: np.ndarray, k: int) -> list[Hit]:
        """`hits` (with their stored codes) reordered by float query x decoded code; top k."""
        if not hits:
            return hits
        codes = np.stack([h.vector for h in hits if h.vector is not None])
        scores = decoded(codes, self.kind, self.calibration) @ query.astype(np.float32)
        order = np.argsort(-scores, kind="stable")[:k]
        return [replace(hits[i], score=float(scores[i]), vector=None) for i in order]

    def close(self) -> None:
        self.inner.close()
