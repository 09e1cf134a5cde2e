"""Schema-safe search: a query is embedded and searched only against vectors of its schema."""

from __future__ import annotations

import numpy as np

from embedserve.errors import InvalidInputError
from embedserve.index.embedder import Embedder
from embedserve.index.errors import SchemaMismatchError
from embedserve.index.multivector import maxsim_search
from embedserve.index.quantized import QuantizingEmbedder
from embedserve.index.sparse import DENSE, SPARSE, Fusion, vector_sources
from embedserve.index.store import LIVE, Hit, Store

MAX_CHUNK_HITS = 16384  # Milvus's largest top-k


def checked_collection(store: Store, embedder: Embedder, role: str) -> str:
    """The collection behind `role`, if its vectors share the embedder's schema; else refuse."""
    collection = store.resolve(role)
    stored = store.schema_of(collection)
    if stored != embedder.meta.embedding_schema:
        raise SchemaMismatchError(
            f"refusing to search the '{role}' index ({collection})",
            stored,
            embedder.meta.embedding_schema,
            f"It was built with model {store.model_of(collection)}: query it with that model and the same "
            "options (version, dimensions, --late-chunking, --sparse, --sparse-model), or migrate the store "
            "(`embedserve migrate`).",
        )
    return collection


def search(
    store: Store,
    embedder: Embedder,
    queries: list[str],
    k: int = 10,
    filter_expr: str = "",
    role: str = LIVE,
    rescore: int = 0,
    fusion: Fusion | None = None,
    depth: int = 100,
) -> list[list[Hit]]:
    """Top-k chunks per query. `rescore` (compressed indexes): fetch that many chunks by the
    compressed search, then order them by the float query x their decoded codes. A sparse
    index is searched by inner product; a hybrid one fuses its dense and sparse top `depth`
    with `fusion` (default rrf, index/sparse.py)."""
    if k < 1 or k > MAX_CHUNK_HITS:
        raise InvalidInputError(f"k must be in [1, {MAX_CHUNK_HITS}], got {k}")
    sources = vector_sources(embedder)
    if not 1 <= depth <= MAX_CHUNK_HITS:
        raise InvalidInputError(f"depth must be in [1, {MAX_CHUNK_HITS}], got {depth}")
    if rescore and SPARSE in sources:
        raise InvalidInputError("rescoring applies to compressed indexes, not sparse or hybrid ones")
    if fusion is not None and set(sources) != {DENSE, SPARSE}:
        raise InvalidInputError("--hybrid fuses a hybrid index's two rankings: pass --sparse-model too")
    collection = checked_collection(store, embedder, role)
    if getattr(embedder, "multivector", False):  # token rows, ranked by exact MaxSim
        if rescore:
            raise InvalidInputError(
                "rescoring applies to compressed indexes; a multi-vector one ranks by MaxSim"
            )
        vectors: list[np.ndarray] = embedder.embed_queries(queries)  # type: ignore[assignment]  # [tokens, dim] each
        return maxsim_search(store, collection, vectors, k, filter_expr, depth)
    if set(sources) == {SPARSE}:
        return store.search(collection, sources[SPARSE].embed_queries(queries), k, filter_expr, field=SPARSE)
    if SPARSE in sources:
        dense, sparse = sources[DENSE].embed_queries(queries), sources[SPARSE].embed_queries(queries)
        ranker = (fusion or Fusion("rrf")).ranker()
        return store.hybrid_search(collection, dense, sparse, k, max(depth, k), ranker, filter_expr)
    if rescore and isinstance(embedder, QuantizingEmbedder):
        codes, floats = embedder.rescore_queries(queries)
        depth = min(max(rescore, k), MAX_CHUNK_HITS)
        found = store.search(collection, codes, depth, filter_expr, with_vectors=True)
        return [embedder.rescored(hits, q, k) for hits, q in zip(found, floats, strict=True)]
    if rescore:
        raise InvalidInputError("rescoring applies to compressed indexes (--embedding-type int8|binary)")
    return store.search(collection, embedder.embed_queries(queries), k, filter_expr)


def rank_documents(hits: list[Hit], depth: int) -> list[str]:
    """Doc ids by their best chunk, best first, at most `depth` (hits arrive best first)."""
    out: list[str] = []
    seen: set[str] = set()
    for h in hits:
        if h.doc_id not in seen:
            seen.add(h.doc_id)
            out.append(h.doc_id)
            if len(out) == depth:
                break
    return out
