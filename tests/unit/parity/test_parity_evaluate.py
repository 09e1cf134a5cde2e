"""Per-bucket evaluation: texts by their own length, queries by the document they must find."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.lengths import bucket_of
from embedserve.parity.datasets import Dataset
from embedserve.parity.evaluate import Vectors, evaluate


def test_bucket_edges() -> None:
    assert [bucket_of(n) for n in (1, 1024, 1025, 4096, 8192, 16384, 16385)] == [
        "0-1K", "0-1K", "1K-4K", "1K-4K", "4K-8K", "8K-16K", "16K+",
    ]  # fmt: skip


def test_evaluate_buckets_cosine_overlap_and_retrieval() -> None:
    rng = np.random.default_rng(0)
    docs = {f"d{i}": f"doc {i}" for i in range(12)}
    queries = {"short": "q1", "long": "q2"}
    qrels = {"short": {"d0": 1}, "long": {"d11": 2, "d3": 0}}
    ds = Dataset("toy", docs, queries, qrels)
    doc_len = [100] * 11 + [3000]  # d11 is the only 1K-4K text
    q_len = [20, 20]
    ref_docs, ref_q = rng.normal(size=(12, 8)), rng.normal(size=(2, 8))
    ref_q[0], ref_q[1] = ref_docs[0] + 0.01, ref_docs[11] + 0.01  # both queries find their doc
    cand_docs = ref_docs.copy()
    cand_docs[11] = -ref_docs[11]  # the candidate ruins the long document
    ref, cand = Vectors(ref_docs, ref_q), Vectors(cand_docs, ref_q)
    out = evaluate(ds, doc_len, q_len, limit=2048, ref=ref, cand=cand)
    assert list(out) == ["0-1K", "1K-4K", "overall"]
    short, long, overall = out["0-1K"], out["1K-4K"], out["overall"]
    assert (short["num_texts"], short["num_queries"], long["num_texts"], long["num_queries"]) == (13, 1, 1, 1)
    assert long["truncated"] == 1 and short["truncated"] == 0 and overall["num_texts"] == 14
    assert short["vector_cosine"]["min"] == pytest.approx(1.0)
    assert long["vector_cosine"]["min"] == pytest.approx(-1.0)
    assert short["retrieval"]["recall@10"]["regression"] == 0.0
    assert long["retrieval"]["recall@10"] == {"reference": 1.0, "candidate": 0.0, "regression": 1.0}
    assert long["top10_overlap"]["mean"] == pytest.approx(0.9)  # d11 left the long query's top 10
    assert overall["top10_overlap"]["worst_query"] == "long"
    assert overall["retrieval"]["recall@100"]["candidate"] == pytest.approx(1.0)  # still in the top 100


def test_evaluate_without_queries() -> None:
    ds = Dataset("rand", {"a": (1, 2), "b": (3, 4)}, {}, {})
    same = Vectors(np.eye(2), np.zeros((0, 2)))
    out = evaluate(ds, [2, 2], [], limit=None, ref=same, cand=same)
    assert list(out) == ["0-1K", "overall"] and "top10_overlap" not in out["overall"]
    assert out["overall"]["vector_cosine"]["count"] == 2
