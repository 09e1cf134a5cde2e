"""`embedserve parity --task rerank`: a candidate reranker's scores against a reference's.

Per dataset (text datasets: cranfield, peps, a BEIR folder), each query reranks its top
`depth` BM25 candidates on both sides. Reported and gated:

    max_abs_diff      largest |candidate - reference| score over every pair
    kendall_tau       rank agreement per query (tau-b): mean and min
    ndcg@10           of each side's reranked list against the qrels; the candidate may lose
                      at most `max_ndcg_drop`
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.embedders.scorers import Scorer, open_scorer
from embedserve.parity.bm25 import BM25
from embedserve.parity.datasets import DatasetContext, find_data_dir, load_dataset
from embedserve.parity.metrics import ndcg_at
from embedserve.parity.options import ParityError


@dataclass(frozen=True)
class RerankSettings:
    reference: str
    candidate: str
    datasets: list[str]
    out: Path
    data_dir: str | None = None
    depth: int = 20
    instruction: str | None = None
    max_abs_diff: float = 1e-4
    min_kendall_tau: float = 0.9
    max_ndcg_drop: float = 0.01


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b of two score lists over the same items (1.0 for fewer than 2 items)."""
    concordant = discordant = ties_a = ties_b = 0
    n = len(a)
    for i in range(n):
        for j in range(i + 1, n):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b))
    return (concordant - discordant) / denom if denom else 1.0


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _ranked(ids: list[str], scores: list[float]) -> list[str]:
    return [ids[i] for i in sorted(range(len(ids)), key=lambda i: (-scores[i], i))]


def _run_dataset(spec: str, ctx: DatasetContext, ref: Scorer, cand: Scorer, depth: int) -> dict[str, Any]:
    ds = load_dataset(spec, ctx)
    doc_ids = list(ds.corpus)
    texts = [str(ds.corpus[d]) for d in doc_ids]
    bm25 = BM25(texts)
    diffs: list[float] = []
    taus: list[float] = []
    ndcg_ref: list[float] = []
    ndcg_cand: list[float] = []
    for qid, query in ds.queries.items():
        if not isinstance(query, str) or not query.strip():
            continue
        scores = bm25.scores(query)
        top = sorted(range(len(texts)), key=lambda i: -scores[i])[:depth]
        ids, docs = [doc_ids[i] for i in top], [texts[i] for i in top]
        r, c = ref(query, docs), cand(query, docs)
        diffs.extend(abs(x - y) for x, y in zip(r, c, strict=True))
        taus.append(kendall_tau(r, c))
        if qid in ds.qrels:
            ndcg_ref.append(ndcg_at(_ranked(ids, r), ds.qrels[qid], 10))
            ndcg_cand.append(ndcg_at(_ranked(ids, c), ds.qrels[qid], 10))
    if not taus:
        raise ParityError(f"dataset {ds.name}: no text queries to rerank")
    return {
        "dataset": ds.name,
        "queries": len(taus),
        "pairs": len(diffs),
        "depth": depth,
        "max_abs_diff": max(diffs),
        "kendall_tau_mean": _mean(taus),
        "kendall_tau_min": min(taus),
        "ndcg@10_reference": _mean(ndcg_ref),
        "ndcg@10_candidate": _mean(ndcg_cand),
    }


def _checks(row: dict[str, Any], s: RerankSettings) -> list[tuple[str, bool]]:
    drop = row["ndcg@10_reference"] - row["ndcg@10_candidate"]
    return [
        (
            f"max_abs_diff {row['max_abs_diff']:.3g} <= {s.max_abs_diff:g}",
            row["max_abs_diff"] <= s.max_abs_diff,
        ),
        (
            f"kendall_tau_min {row['kendall_tau_min']:.4f} >= {s.min_kendall_tau:g}",
            row["kendall_tau_min"] >= s.min_kendall_tau,
        ),
        (f"ndcg@10 drop {drop:.4f} <= {s.max_ndcg_drop:g}", not drop > s.max_ndcg_drop),
    ]


def run_rerank(s: RerankSettings) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows per dataset and the failed checks; writes report.json / report.md under `out`."""
    ctx = DatasetContext(find_data_dir(s.data_dir), lambda t: len(t.split()), [], None)
    ref, close_ref = open_scorer(s.reference, s.instruction)
    try:
        cand, close_cand = open_scorer(s.candidate, s.instruction)
        try:
            rows = [_run_dataset(spec, ctx, ref, cand, s.depth) for spec in s.datasets or ["cranfield"]]
        finally:
            close_cand()
    finally:
        close_ref()
    failed = []
    lines = [
        "| dataset | queries | pairs | max abs diff | Kendall tau mean / min | nDCG@10 ref / cand | gate |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for row in rows:
        checks = _checks(row, s)
        row["checks"] = {name: ok for name, ok in checks}
        failed += [f"{row['dataset']}: {name}" for name, ok in checks if not ok]
        lines.append(
            f"| {row['dataset']} | {row['queries']} | {row['pairs']} | {row['max_abs_diff']:.2e} | "
            f"{row['kendall_tau_mean']:.4f} / {row['kendall_tau_min']:.4f} | "
            f"{row['ndcg@10_reference']:.4f} / {row['ndcg@10_candidate']:.4f} | "
            f"{'pass' if all(ok for _, ok in checks) else 'FAIL'} |"
        )
    s.out.mkdir(parents=True, exist_ok=True)
    meta = {"reference": s.reference, "candidate": s.candidate, "task": "rerank"}
    (s.out / "report.json").write_text(json.dumps({**meta, "datasets": rows}, indent=2))
    header = f"# Rerank parity\n\nreference `{s.reference}`, candidate `{s.candidate}`\n\n"
    (s.out / "report.md").write_text(header + "\n".join(lines) + "\n")
    return rows, failed
