"""Turn both sides' vectors for one dataset into the per-bucket numbers the gate checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.lengths import BUCKET_NAMES, bucket_of
from embedserve.parity.datasets import Dataset
from embedserve.parity.metrics import (
    cosine_rows,
    cosine_stats,
    mean_over,
    norm_stats,
    overlap_at,
    rank,
    retrieval_scores,
    sparse_stats,
)
from embedserve.pooling.outputs import Output

OVERALL = "overall"
SPARSE = Output.SPARSE.value  # a bucket entry's section for sparse vectors' own statistics
TOP_K = 10
SEARCH_DEPTH = 100  # deepest cut any metric reads (Recall@100)


@dataclass(frozen=True)
class Vectors:
    docs: np.ndarray  # [num_docs, dim] in corpus order
    queries: np.ndarray  # [num_queries, dim] in query order


def _query_lengths_for_buckets(ds: Dataset, doc_len: dict[str, int], q_len: dict[str, int]) -> dict[str, int]:
    """A query is bucketed by its longest relevant document (what it has to find), else itself."""
    out = {}
    for qid in ds.queries:
        relevant = [doc_len[d] for d, g in ds.qrels.get(qid, {}).items() if g > 0]
        out[qid] = max(relevant) if relevant else q_len[qid]
    return out


def evaluate(
    ds: Dataset,
    doc_lengths: Sequence[int],
    query_lengths: Sequence[int],
    limit: int | None,
    ref: Vectors,
    cand: Vectors,
    sparse: bool = False,
) -> dict[str, dict[str, Any]]:
    """{bucket: numbers} for every non-empty bucket, then `overall`; `sparse` (SPLADE term
    weights): their non-zero sets compared too, search by inner product."""
    doc_ids, query_ids = list(ds.corpus), list(ds.queries)
    lengths = np.asarray([*doc_lengths, *query_lengths])
    ref_all = np.concatenate([ref.docs, ref.queries]) if query_ids else ref.docs
    cand_all = np.concatenate([cand.docs, cand.queries]) if query_ids else cand.docs
    cos = cosine_rows(ref_all, cand_all)
    if sparse:  # a text without a weight on either side (BGE-M3: specials only) agrees
        cos[~ref_all.any(axis=1) & ~cand_all.any(axis=1)] = 1.0
    text_bucket = np.asarray([bucket_of(int(n)) for n in lengths])

    per_query: dict[str, dict[str, Any]] = {}
    ref_scores: dict[str, dict[str, float]] = {}
    cand_scores: dict[str, dict[str, float]] = {}
    if query_ids:
        ref_runs = rank(ref.queries, ref.docs, doc_ids, SEARCH_DEPTH, sparse)
        cand_runs = rank(cand.queries, cand.docs, doc_ids, SEARCH_DEPTH, sparse)
        for qid, r, c in zip(query_ids, ref_runs, cand_runs, strict=True):
            per_query[qid] = {"overlap": overlap_at(r, c, TOP_K)}
        ref_scores = retrieval_scores(dict(zip(query_ids, ref_runs, strict=True)), ds.qrels)
        cand_scores = retrieval_scores(dict(zip(query_ids, cand_runs, strict=True)), ds.qrels)
    q_bucket_len = _query_lengths_for_buckets(
        ds, dict(zip(doc_ids, doc_lengths, strict=True)), dict(zip(query_ids, query_lengths, strict=True))
    )
    q_bucket = {q: bucket_of(n) for q, n in q_bucket_len.items()}

    out: dict[str, dict[str, Any]] = {}
    for name in (*BUCKET_NAMES, OVERALL):
        mask = np.ones(len(lengths), bool) if name == OVERALL else text_bucket == name
        qids = [q for q in query_ids if name in (OVERALL, q_bucket[q])]
        if not mask.any() and not qids:
            continue
        entry: dict[str, Any] = {
            "num_texts": int(mask.sum()),
            "num_queries": len(qids),
            "truncated": int((lengths[mask] > limit).sum()) if limit else 0,
            "max_tokens": int(lengths[mask].max()) if mask.any() else 0,
            "vector_cosine": cosine_stats(cos[mask]),
            "norm": norm_stats(ref_all[mask], cand_all[mask]),
        }
        if sparse:
            entry[SPARSE] = sparse_stats(ref_all[mask], cand_all[mask])
        if qids:
            overlaps = [per_query[q]["overlap"] for q in qids]
            worst = int(np.argmin(overlaps))
            entry["top10_overlap"] = {
                "mean": float(np.mean(overlaps)),
                "worst": float(overlaps[worst]),
                "worst_query": qids[worst],
                "count": len(qids),
            }
            judged = [q for q in qids if q in ds.qrels]
            if judged:
                rm, cm = mean_over(ref_scores, judged), mean_over(cand_scores, judged)
                entry["retrieval"] = {
                    m: {"reference": rm[m], "candidate": cm[m], "regression": rm[m] - cm[m]} for m in rm
                }
                entry["retrieval_queries"] = len(judged)
        out[name] = entry
    return out
