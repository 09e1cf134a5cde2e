"""Parity and retrieval metrics.

Retrieval follows trec_eval conventions (checked against pytrec-eval-terrier in the tests):
ranking by score descending with ties broken by document id descending; gain = the judged
relevance (<= 0 counts 0); nDCG@k = DCG@k / ideal DCG@k with discount log2(rank + 1), the
ideal built from every judged document; Recall@k = relevant retrieved in the top k / all
relevant (0 when a query has none); the mean runs over every judged query, so a judged
query missing from the run scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Ranking = list[str]  # doc ids, best first


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, d] arrays, computed in float64 (0 for a zero vector)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    na, nb = np.linalg.norm(a64, axis=1), np.linalg.norm(b64, axis=1)
    dots = np.sum(a64 * b64, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where((na > 0) & (nb > 0), dots / (na * nb), 0.0)
    return np.asarray(out)


def cosine_stats(values: np.ndarray) -> dict[str, Any]:
    """p50 / p01 (numpy's linear percentile) / min / count of per-vector cosines."""
    if values.size == 0:
        return {"count": 0}
    return {
        "p50": float(np.percentile(values, 50)),
        "p01": float(np.percentile(values, 1)),
        "min": float(values.min()),
        "count": int(values.size),
    }


def norm_stats(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Largest relative difference of vector norms (cosine cannot see a lost normalization)."""
    na, nb = np.linalg.norm(a.astype(np.float64), axis=1), np.linalg.norm(b.astype(np.float64), axis=1)
    rel = np.abs(na - nb) / np.maximum(na, 1e-12)
    return {"max_rel_diff": float(rel.max()) if rel.size else 0.0}


def sparse_stats(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Vocabulary-wide weight rows: per row, the Jaccard of their non-zero id sets (p50 / p01 /
    min), how many rows have equal sets, and the largest weight difference."""
    na, nb = a != 0, b != 0
    union = (na | nb).sum(axis=1)
    jaccard = np.where(union == 0, 1.0, (na & nb).sum(axis=1) / np.maximum(union, 1))  # both empty: equal
    equal = (na == nb).all(axis=1)
    diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0
    stats = cosine_stats(jaccard)
    return {"index_jaccard": stats, "equal_index_sets": float(equal.mean()) if equal.size else 1.0,
            "max_abs_diff": diff}  # fmt: skip


def rank(
    queries: np.ndarray, docs: np.ndarray, doc_ids: Sequence[str], k: int, dot: bool = False
) -> list[Ranking]:
    """Exact cosine search (`dot`: inner product, as sparse vectors are searched): the top-k doc
    ids per query (trec_eval tie order)."""
    q = queries.astype(np.float64)
    d = docs.astype(np.float64)
    if not dot:
        q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
    scores = q @ d.T  # [num_queries, num_docs]
    # Sorting by id descending first, then a stable sort by score, gives trec_eval's tie order.
    by_id = sorted(range(len(doc_ids)), key=lambda i: doc_ids[i], reverse=True)
    ids = np.asarray(by_id)
    out = []
    for row in scores:
        order = ids[np.argsort(-row[ids], kind="stable")][:k]
        out.append([doc_ids[i] for i in order])
    return out


def overlap_at(a: Ranking, b: Ranking, k: int) -> float:
    """Share of a's top k found in b's top k (k shrinks to the corpus size)."""
    k = min(k, len(a), len(b))
    return len(set(a[:k]) & set(b[:k])) / k if k else 1.0


def ndcg_at(ranking: Ranking, judged: Mapping[str, int], k: int) -> float:
    dcg = sum(max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]))
    ideal_gains = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal_gains))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranking: Ranking, judged: Mapping[str, int], k: int) -> float:
    relevant = {d for d, g in judged.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranking[:k])) / len(relevant)


RETRIEVAL_METRICS = {"ndcg@10": (ndcg_at, 10), "recall@10": (recall_at, 10), "recall@100": (recall_at, 100)}


def retrieval_scores(
    runs: Mapping[str, Ranking], qrels: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, float]]:
    """Per judged query: {metric: value}; a query missing from `runs` scores 0."""
    out: dict[str, dict[str, float]] = {}
    for qid, judged in qrels.items():
        ranking = runs.get(qid, [])
        out[qid] = {name: fn(ranking, judged, k) for name, (fn, k) in RETRIEVAL_METRICS.items()}
    return out


def mean_over(per_query: Mapping[str, Mapping[str, float]], qids: Sequence[str]) -> dict[str, float]:
    """Mean of each metric over `qids` (every one must be judged)."""
    if not qids:
        return {}
    return {name: float(np.mean([per_query[q][name] for q in qids])) for name in RETRIEVAL_METRICS}
