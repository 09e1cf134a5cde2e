"""A deterministic bag-of-words embedder: fast, and retrieval on it behaves predictably
(a query finds the documents sharing its words), so store and pipeline logic can be tested
without a model."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from embedserve.index.embedder import VectorMeta
from embedserve.tokenizer import Tokenizer

DIM = 64


def _bucket(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little") % DIM


class WordEmbedder:
    def __init__(
        self, tokenizer: Tokenizer, schema: str = "es1-words", model: str = "words", late: bool = False
    ) -> None:
        self.late = late  # late chunking: a chunk's vector is its words plus half its window's
        self.late_prompt_tokens = 0
        self.meta = VectorMeta(model, "v1", "float32", "cpu-fp32", schema + ("-late" if late else ""))
        self.windows: list[str] = []  # every window embedded late, in order
        self.dimension = DIM
        self.tokenizer: Tokenizer | None = tokenizer
        self.max_tokens: int | None = 4096
        self.embedded: list[str] = []  # every text embedded as a document, in order

    def _vectors(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[i, _bucket(word)] += 1.0
        out += 1e-3  # no zero vector: cosine needs a norm
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.embedded.extend(texts)
        return self._vectors(texts)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._vectors(texts)

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        out = []
        for text, spans in windows:
            self.windows.append(text)
            rows = self._vectors([text[a:b] for a, b in spans]) + 0.5 * self._vectors([text])
            out.append(rows / np.linalg.norm(rows, axis=1, keepdims=True))
        return out

    def close(self) -> None:
        pass
