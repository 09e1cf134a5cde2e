"""Retrieval metrics follow trec_eval: checked against pytrec-eval-terrier to 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.parity.metrics import (
    cosine_rows,
    cosine_stats,
    mean_over,
    overlap_at,
    rank,
    retrieval_scores,
)

pytrec_eval = pytest.importorskip("pytrec_eval")


def _random_case(seed: int) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]], list[str]]:
    rng = np.random.default_rng(seed)
    doc_ids = [f"d{i}" for i in range(150)]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(30):
        qid = f"q{q}"
        judged = rng.choice(doc_ids, size=int(rng.integers(1, 25)), replace=False)
        # graded gains 0..4 (0 = judged non-relevant); every 7th query has no relevant doc at all
        top = 5 if q % 7 else 1
        qrels[qid] = {str(d): int(rng.integers(0, top)) for d in judged}
        if q % 10 == 9:
            continue  # judged but missing from the run: must count as 0
        # coarse scores make ties, which trec_eval breaks by doc id (descending)
        run[qid] = {d: float(rng.integers(0, 40)) / 40 for d in doc_ids}
    return qrels, run, doc_ids


def _ranking(scores: dict[str, float], k: int) -> list[str]:
    return sorted(scores, key=lambda d: (scores[d], d), reverse=True)[:k]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ndcg_and_recall_match_pytrec_eval(seed: int) -> None:
    qrels, run, _ = _random_case(seed)
    measures = {"ndcg_cut.10", "recall.10", "recall.100"}
    ref = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    mine = retrieval_scores({q: _ranking(s, 100) for q, s in run.items()}, qrels)
    names = {"ndcg_cut_10": "ndcg@10", "recall_10": "recall@10", "recall_100": "recall@100"}
    for qid, values in ref.items():
        for theirs, ours in names.items():
            assert mine[qid][ours] == pytest.approx(values[theirs], abs=1e-6), (qid, ours)
    # trec_eval -c: judged queries absent from the run score 0 and count in the mean
    missing = [q for q in qrels if q not in run]
    assert missing and all(mine[q]["recall@10"] == 0.0 for q in missing)
    means = mean_over(mine, list(qrels))
    for theirs, ours in names.items():
        expected = sum(ref[q][theirs] for q in ref) / len(qrels)
        assert means[ours] == pytest.approx(expected, abs=1e-6)


def test_rank_breaks_ties_like_trec_eval() -> None:
    docs = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])  # d0, d1, d3 tie on cosine
    ids = ["d0", "d1", "d2", "d3"]
    [ranking] = rank(np.array([[1.0, 0.0]]), docs, ids, k=4)
    assert ranking == ["d3", "d1", "d0", "d2"]
    qrels = {"q": {"d0": 2, "d2": 1}}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(
        {"q": {"d0": 1.0, "d1": 1.0, "d2": 0.0, "d3": 1.0}}
    )
    assert retrieval_scores({"q": ranking}, qrels)["q"]["ndcg@10"] == pytest.approx(
        ref["q"]["ndcg_cut_10"], abs=1e-9
    )


def test_rank_is_exact_cosine_search() -> None:
    rng = np.random.default_rng(3)
    queries, docs = rng.normal(size=(5, 8)), rng.normal(size=(40, 8)) * rng.uniform(0.1, 9, size=(40, 1))
    ids = [f"d{i:02d}" for i in range(40)]
    rankings = rank(queries, docs, ids, k=10)
    unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    for q, got in zip(queries, rankings, strict=True):
        expected = np.argsort(-(unit @ q))[:10]
        assert got == [ids[i] for i in expected]


def test_overlap_and_cosine_stats() -> None:
    assert overlap_at(list("abcdefghij"), list("abcdefghiz"), 10) == pytest.approx(0.9)
    assert overlap_at(["a", "b"], ["b", "a"], 10) == 1.0  # k shrinks to the corpus size
    a = np.eye(3, dtype=np.float32)
    b = np.array([[1, 0, 0], [0, -1, 0], [0, 1, 1]], dtype=np.float32)
    cos = cosine_rows(a, b)
    np.testing.assert_allclose(cos, [1.0, -1.0, 1 / np.sqrt(2)], atol=1e-7)
    stats = cosine_stats(cos)
    assert stats["count"] == 3 and stats["min"] == pytest.approx(-1.0)
    assert stats["p50"] == pytest.approx(1 / np.sqrt(2))
    assert cosine_stats(np.zeros(0)) == {"count": 0}
