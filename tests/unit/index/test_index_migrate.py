"""Dual-index upgrades on Milvus Lite: shadow report numbers, cutover, rollback."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import load_tokenizer
from embedserve.index.errors import StoreError
from embedserve.index.migrate import cutover, rollback, shadow_report, status
from embedserve.index.pipeline import index_documents
from embedserve.index.search import rank_documents, search
from embedserve.index.shadow_io import render_markdown, write_report
from embedserve.index.store import LIVE, PREVIOUS, SHADOW, Hit, Store, collection_name
from embedserve.parity.metrics import ndcg_at
from tests.helpers.index_fakes import WordEmbedder
from tests.helpers.tiny_models import qwen_tokenizer_dir

DOCS = [
    Document("wing", "Flutter of a swept wing at transonic speed."),
    Document("layer", "Laminar boundary layer on a flat plate with suction."),
    Document("shock", "Oblique shock wave reflection from a wall."),
    Document("heat", "Heat transfer to a blunt body in hypersonic flow."),
]
QUERIES = {"q1": "swept wing flutter", "q2": "shock wave reflection", "q3": "heat transfer blunt body"}
QRELS = {"q1": {"wing": 2}, "q2": {"shock": 1, "layer": 1}, "q3": {"heat": 3}}


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(load_tokenizer(qwen_tokenizer_dir()), 64, 0)


def test_shadow_cutover_rollback(store: Store, chunker: Chunker, tmp_path: Path) -> None:
    old = WordEmbedder(chunker.tokenizer, "es1-old", "old")
    new = WordEmbedder(chunker.tokenizer, "es1-new", "new")
    with pytest.raises(StoreError, match="no shadow index"):
        cutover(store)
    index_documents(DOCS, old, store, chunker, progress=False)
    index_documents(DOCS, new, store, chunker, role=SHADOW, progress=False)
    a, b = collection_name("es1-old"), collection_name("es1-new")
    assert status(store) == {
        LIVE: {"collection": a, "embedding_schema": "es1-old", "rows": 4},
        SHADOW: {"collection": b, "embedding_schema": "es1-new", "rows": 4},
    }

    report = shadow_report(store, old, new, QUERIES, QRELS)
    # Both sides embed words the same way, so they must rank identically.
    assert report["top10_overlap"]["mean"] == 1.0 and report["num_judged_queries"] == 3
    ranking = report["top10"]["live"]["q2"]
    assert ranking[0] == "shock" and sorted(ranking) == sorted(d.doc_id for d in DOCS)
    expected = sum(ndcg_at(report["top10"]["live"][q], QRELS[q], 10) for q in QUERIES) / 3
    assert report["retrieval"]["ndcg@10"] == {"live": expected, "shadow": expected, "delta": 0.0}
    assert report["retrieval"]["recall@10"]["live"] == 1.0
    assert report["live"]["embedding_schema"] == "es1-old" and report["shadow"]["model"] == "new"
    md = render_markdown(report)
    assert "| live vs shadow | 1.0000 |" in md and f"{expected:.4f} → {expected:.4f} (+0.0000)" in md
    js, mdfile = write_report(report, tmp_path / "out")
    assert js.is_file() and mdfile.read_text() == md
    # Each side must be searched with its own model.
    with pytest.raises(StoreError, match="refusing to search"):
        shadow_report(store, new, old, QUERIES)

    assert cutover(store) == {LIVE: b, PREVIOUS: a}
    assert search(store, new, ["shock"])[0][0].doc_id == "shock"
    with pytest.raises(StoreError, match="refusing to search"):
        search(store, old, ["shock"])
    assert rollback(store) == {LIVE: a, SHADOW: b}
    assert search(store, old, ["shock"])[0][0].doc_id == "shock"
    with pytest.raises(StoreError, match="nothing to roll back"):
        rollback(store)


def test_rank_documents_keeps_each_doc_once_best_first() -> None:
    hits = [Hit("a", 0, 0.9, ""), Hit("b", 1, 0.8, ""), Hit("a", 2, 0.7, ""), Hit("c", 0, 0.6, "")]
    assert rank_documents(hits, 10) == ["a", "b", "c"]
    assert rank_documents(hits, 2) == ["a", "b"]


def test_shadow_needs_queries_and_judged_ones(store: Store, chunker: Chunker) -> None:
    old = WordEmbedder(chunker.tokenizer, "es1-old", "old")
    new = WordEmbedder(chunker.tokenizer, "es1-new", "new")
    index_documents(DOCS, old, store, chunker, progress=False)
    index_documents(DOCS, new, store, chunker, role=SHADOW, progress=False)
    with pytest.raises(StoreError, match="empty"):
        shadow_report(store, old, new, {})
    with pytest.raises(StoreError, match="no query of the query set has relevance judgments"):
        shadow_report(store, old, new, QUERIES, {"other": {"wing": 1}})
