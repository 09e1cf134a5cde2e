"""Sparse and hybrid indexes (`index --sparse`, `index --hybrid --sparse-model DIR`).

A SPLADE model's vectors are vocabulary-wide term weights with few non-zeros; Milvus stores
them as a SPARSE_FLOAT_VECTOR field (`{vocabulary id: weight}`) searched by inner product, as
SPLADE scores. A hybrid index holds both fields per chunk, the dense model's `vector` and the
SPLADE model's `sparse`, and a search fuses the two rankings in Milvus (`hybrid_search`):
reciprocal rank fusion (`rrf`, k = 60) or a weighted sum of the two scores
(`weighted:W_DENSE,W_SPARSE`).

    collection    id | vector (dense, COSINE) | sparse (SPARSE_FLOAT_VECTOR, IP) | doc_id ...
    --sparse             -                       the SPLADE model's
    --hybrid             the dense model's       the SPLADE model's

The index's schema is the sparse vectors' (as `serve` reports them for `embedding_type:
sparse`), or for a hybrid index one made of both models' schemas: neither model can be
swapped without building a new index.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from embedserve.api.sparse import nonzero
from embedserve.index.embedder import Embedder, VectorMeta
from embedserve.index.errors import StoreError
from embedserve.index.http_embedder import HttpEmbedder
from embedserve.pooling.outputs import Output
from embedserve.schema import compressed_schema
from embedserve.tokenizer import Tokenizer

DENSE, SPARSE = "vector", Output.SPARSE.value  # the collection's vector fields
RRF_K = 60


# Milvus refuses a sparse vector without a non-zero weight (a chunk whose every weight is 0, as
# BGE-M3's lexical weights of a chunk of special tokens or punctuation can be): such a row is
# stored as the smallest normal float32 at id 0, which moves any score by less than 1e-37.
EMPTY_ROW = {0: float(np.finfo(np.float32).tiny)}


def sparse_rows(vectors: np.ndarray) -> list[dict[int, float]]:
    """Each vocabulary-wide row's non-zero weights, as Milvus takes a sparse vector."""
    return storable([dict(zip(*(part.tolist() for part in nonzero(v)), strict=True)) for v in vectors])


def storable(rows: list[dict[int, float]]) -> list[dict[int, float]]:
    """Rows as Milvus takes them: an empty one as `EMPTY_ROW`."""
    return [row or dict(EMPTY_ROW) for row in rows]


class SparseEmbedder:
    """A SPLADE model's embedder whose vectors are sparse rows (`sparse_rows`), or BGE-M3's lexical
    weights (its dense side's engine, `owns` False when the dense side closes it)."""

    def __init__(self, inner: Embedder, owns: bool = True) -> None:
        engine = getattr(inner, "engine", None)
        self.owns = owns
        # an endpoint asked for sparse vectors (index/http_embedder.py): its server checked the model
        self.remote = isinstance(inner, HttpEmbedder) and inner.sparse
        outputs = frozenset() if engine is None else engine.outputs
        self.lexical = Output.SPARSE not in outputs and Output.LEXICAL in outputs
        if not self.remote and Output.SPARSE not in outputs and not self.lexical:
            model = inner.meta.model
            raise StoreError(
                f"--sparse stores a SPLADE model's vectors (or BGE-M3's lexical weights): {model} gives "
                "dense vectors only; pass a sentence-transformers SparseEncoder directory or a server of "
                "one, or --sparse-model DIR|URL beside it (--hybrid)"
            )
        if inner.late:
            raise StoreError("late chunking pools dense vectors: it does not combine with a sparse index")
        self.inner = inner
        # The schema `serve` reports for these vectors (an endpoint tells it; index built through
        # one equals index built in process): BGE-M3's lexical weights are unnormalized.
        schema = inner.meta.embedding_schema
        if self.lexical:
            schema = inner.metadata.schema(None, False, SPARSE)  # type: ignore[attr-defined]
        elif not self.remote:
            schema = compressed_schema(schema, SPARSE)
        self.meta: VectorMeta = replace(inner.meta, embedding_schema=schema)
        self.dimension = int(engine.config.model.vocab_size) if engine is not None else 0
        self.tokenizer: Tokenizer | None = inner.tokenizer
        self.max_tokens: int | None = inner.max_tokens
        self.late = False
        self.late_prompt_tokens = 0

    def embed_documents(self, texts: list[str]) -> list[dict[int, float]]:
        return self._rows(texts, queries=False)

    def embed_queries(self, texts: list[str]) -> list[dict[int, float]]:
        return self._rows(texts, queries=True)

    def _rows(self, texts: list[str], queries: bool) -> list[dict[int, float]]:
        inner: Any = self.inner
        if self.remote:
            return storable(inner.embed_sparse(texts, queries=queries))
        if self.lexical:
            return sparse_rows(inner.embed_lexical(texts, queries=queries))
        return sparse_rows(inner.embed_queries(texts) if queries else inner.embed_documents(texts))

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        raise StoreError("late chunking does not combine with a sparse index")

    def close(self) -> None:
        if self.owns:
            self.inner.close()


class HybridEmbedder:
    """A dense embedder and a SPLADE one for the same chunks: each chunk gets both vectors."""

    def __init__(self, dense: Embedder, sparse: SparseEmbedder) -> None:
        if dense.late:
            raise StoreError("late chunking does not combine with a hybrid index (its sparse side)")
        d_tok, s_tok = dense.tokenizer, sparse.tokenizer
        if d_tok is not None and s_tok is not None and d_tok.backend.get_vocab() != s_tok.backend.get_vocab():
            raise StoreError(
                "a hybrid index cuts chunks in one tokenizer: the dense and the SPLADE model must share "
                "theirs (their vocabularies differ)"
            )
        self.dense, self.sparse = dense, sparse
        d, s = dense.meta, sparse.meta
        joined = f"{d.embedding_schema}|hybrid|{s.embedding_schema}"
        self.meta = VectorMeta(
            model=f"{d.model}+{s.model}",
            model_version=f"{d.model_version}+{s.model_version}",
            dtype=f"{d.dtype}+{s.dtype}",
            backend_profile=f"{d.backend_profile}+{s.backend_profile}",
            embedding_schema="es1-" + hashlib.sha256(joined.encode()).hexdigest()[:16],
        )
        self.dimension = dense.dimension
        self.tokenizer: Tokenizer | None = dense.tokenizer  # chunks are cut in the dense model's tokens
        limits = [m for m in (dense.max_tokens, sparse.max_tokens) if m is not None]
        self.max_tokens: int | None = min(limits) if limits else None
        self.late = False
        self.late_prompt_tokens = 0

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        raise StoreError("a hybrid index embeds each side apart (index/sparse.py vector_sources)")

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        raise StoreError("a hybrid index searches each side apart (index/search.py)")

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        raise StoreError("late chunking does not combine with a hybrid index")

    def close(self) -> None:
        try:
            self.dense.close()
        finally:
            self.sparse.close()


def vector_sources(embedder: Any) -> dict[str, Any]:
    """The collection's vector fields and the embedder filling each."""
    if isinstance(embedder, HybridEmbedder):
        return {DENSE: embedder.dense, SPARSE: embedder.sparse}
    if isinstance(embedder, SparseEmbedder):
        return {SPARSE: embedder}
    return {DENSE: embedder}


@dataclass(frozen=True)
class Fusion:
    """How a hybrid search fuses its two rankings."""

    kind: str  # "rrf" or "weighted"
    weights: tuple[float, float] = (1.0, 1.0)  # dense, sparse (weighted)

    @classmethod
    def parse(cls, text: str) -> Fusion:
        if text == "rrf":
            return cls("rrf")
        if text.startswith("weighted:"):
            parts = text.removeprefix("weighted:").split(",")
            try:
                weights = tuple(float(p) for p in parts)
            except ValueError:
                weights = ()
            if len(weights) == 2 and all(0 <= w <= 1 for w in weights) and sum(weights) > 0:
                return cls("weighted", (weights[0], weights[1]))
        raise StoreError(
            f"--hybrid {text!r}: expected rrf or weighted:W_DENSE,W_SPARSE (weights in [0, 1], not both 0)"
        )

    def ranker(self) -> Any:
        from pymilvus import RRFRanker, WeightedRanker

        return RRFRanker(RRF_K) if self.kind == "rrf" else WeightedRanker(*self.weights)
