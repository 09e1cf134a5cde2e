"""Model upgrades with two indexes: build a shadow, compare it with live, cut over, roll back.

    build:     live -> A (old model)        shadow -> B (new model, built while A serves)
    shadow:    the same queries against A (old model) and B (new model): overlap, nDCG, recall
    cutover:   previous -> A, live -> B     (one alias move: readers see A or B, never a mix)
    rollback:  live -> A, shadow -> B       (the state before cutover)

Each side is searched only with its own model: `checked_collection` refuses a query embedder
whose schema differs from the collection's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from embedserve.index.embedder import Embedder
from embedserve.index.errors import StoreError
from embedserve.index.search import MAX_CHUNK_HITS, checked_collection, rank_documents, search
from embedserve.index.sparse import DENSE, SPARSE, Fusion, vector_sources
from embedserve.index.store import LIVE, PREVIOUS, SHADOW, Store
from embedserve.parity.metrics import mean_over, overlap_at, retrieval_scores

OVERLAP_K = 10
# Chunks fetched per document wanted: documents split into many chunks fill the top ranks
# with repeats, and ranking needs `depth` distinct documents.
_CHUNKS_PER_DOC = 10


def _side(store: Store, embedder: Embedder, role: str) -> dict[str, Any]:
    collection = checked_collection(store, embedder, role)
    rows = store.count(collection)
    return {
        "role": role,
        "collection": collection,
        "rows": rows,
        "dimension": embedder.dimension,
        **embedder.meta.fields(),
    }


def _rankings(
    store: Store, embedder: Embedder, collection: str, queries: Mapping[str, str], depth: int, role: str
) -> dict[str, list[str]]:
    qids = list(queries)
    limit = min(depth * _CHUNKS_PER_DOC, MAX_CHUNK_HITS)
    sources = vector_sources(embedder)
    out: dict[str, list[str]] = {}
    if SPARSE in sources:  # sparse or hybrid: the index's own search (index/search.py)
        fusion = Fusion("rrf") if DENSE in sources else None
        for start in range(0, len(qids), 32):
            batch = qids[start : start + 32]
            hits = search(
                store, embedder, [queries[q] for q in batch], limit, role=role, fusion=fusion, depth=limit
            )
            out.update({qid: rank_documents(h, depth) for qid, h in zip(batch, hits, strict=True)})
        return out
    vectors = embedder.embed_queries([queries[q] for q in qids])
    # Modest search batches keep each answer (queries x limit hits) small.
    for start in range(0, len(qids), 32):
        hits = store.search(collection, vectors[start : start + 32], limit, with_text=False)
        for qid, h in zip(qids[start : start + 32], hits, strict=True):
            out[qid] = rank_documents(h, depth)
    return out


def shadow_report(
    store: Store,
    live_embedder: Embedder,
    shadow_embedder: Embedder,
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    depth: int = 100,
) -> dict[str, Any]:
    """Run `queries` against live and shadow, each with its own model."""
    if not queries:
        raise StoreError("the query set is empty")
    live = _side(store, live_embedder, LIVE)
    shadow = _side(store, shadow_embedder, SHADOW)
    runs_live = _rankings(store, live_embedder, live["collection"], queries, depth, LIVE)
    runs_shadow = _rankings(store, shadow_embedder, shadow["collection"], queries, depth, SHADOW)
    overlaps = np.asarray([overlap_at(runs_live[q], runs_shadow[q], OVERLAP_K) for q in queries])
    report: dict[str, Any] = {
        "live": live,
        "shadow": shadow,
        "num_queries": len(queries),
        f"top{OVERLAP_K}_overlap": {
            "mean": float(overlaps.mean()),
            "min": float(overlaps.min()),
            "p10": float(np.percentile(overlaps, 10)),
            "identical_share": float(np.mean(overlaps == 1.0)),
        },
        "top10": {
            "live": {q: r[:OVERLAP_K] for q, r in runs_live.items()},
            "shadow": {q: r[:OVERLAP_K] for q, r in runs_shadow.items()},
        },
    }
    if qrels is not None:
        judged = [q for q in queries if q in qrels]
        if not judged:
            raise StoreError("no query of the query set has relevance judgments in the qrels")
        sub = {q: qrels[q] for q in judged}
        live_means = mean_over(retrieval_scores(runs_live, sub), judged)
        shadow_means = mean_over(retrieval_scores(runs_shadow, sub), judged)
        report["num_judged_queries"] = len(judged)
        report["retrieval"] = {
            m: {"live": live_means[m], "shadow": shadow_means[m], "delta": shadow_means[m] - live_means[m]}
            for m in live_means
        }
    return report


def cutover(store: Store) -> dict[str, str]:
    """live -> the shadow collection; the old live collection stays as `previous`."""
    roles = store.aliases()
    if SHADOW not in roles:
        raise StoreError("no shadow index to cut over to: run `embedserve migrate build` first")
    if roles.get(LIVE) == roles[SHADOW]:
        store.unpoint(SHADOW)  # a cutover interrupted after its alias move: finish it
        return store.aliases()
    if LIVE in roles:
        store.point(PREVIOUS, roles[LIVE])
    store.point(LIVE, roles[SHADOW])
    store.unpoint(SHADOW)
    return store.aliases()


def rollback(store: Store) -> dict[str, str]:
    """live -> the previous collection; the rolled-back one becomes the shadow again."""
    roles = store.aliases()
    if PREVIOUS not in roles:
        raise StoreError("nothing to roll back to: the store has no previous index (no cutover yet)")
    if LIVE in roles and roles[LIVE] != roles[PREVIOUS]:
        store.point(SHADOW, roles[LIVE])
    store.point(LIVE, roles[PREVIOUS])
    store.unpoint(PREVIOUS)
    return store.aliases()


def status(store: Store) -> dict[str, dict[str, Any]]:
    """Role -> collection, schema and row count."""
    return {
        role: {"collection": c, "embedding_schema": store.schema_of(c), "rows": store.count(c)}
        for role, c in sorted(store.aliases().items())
    }
