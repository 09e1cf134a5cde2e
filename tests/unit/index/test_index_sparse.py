"""Sparse and hybrid indexes in Milvus Lite: a SPLADE model's sparse top-10 equals a numpy
brute force over every chunk; a hybrid search's RRF equals one written here; the refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.cli import main
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.errors import StoreError
from embedserve.index.pipeline import index_documents
from embedserve.index.search import rank_documents, search
from embedserve.index.sparse import Fusion, HybridEmbedder, SparseEmbedder
from embedserve.index.store import Store
from tests.helpers.engine_calls import embed_lexical
from tests.helpers.real_text import topic
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_rerankers import build_cross_encoder
from tests.helpers.tiny_sparse import build_splade

TOPICS = ("assert", "pass", "del", "return", "yield", "raise", "break", "continue")
DOCS = [Document(name, topic(name)) for name in TOPICS]
QUERIES = ["raise an exception", "leave the loop early", "generator function values"]


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_splade(tmp_path_factory.mktemp("splade") / "max")


@pytest.fixture(scope="module")
def engines(splade: Path) -> Iterator[tuple[Engine, Engine]]:
    with Engine.from_pretrained(minilm_dir()) as dense, Engine.from_pretrained(splade) as sparse:
        yield dense, sparse


def _chunks(engine: Engine) -> list[tuple[str, int, str]]:
    chunker = Chunker(engine.tokenizer, 64, 0)
    return [(d.doc_id, i, c.text) for d in DOCS for i, c in enumerate(chunker.split(d.text))]


def test_sparse_top10_equals_a_brute_force(engines: tuple[Engine, Engine], store: Store) -> None:
    _, engine = engines
    embedder = SparseEmbedder(EngineEmbedder(engine, "splade"))
    stats = index_documents(DOCS, embedder, store, Chunker(engine.tokenizer, 64, 0), progress=False)
    chunks = _chunks(engine)
    assert stats.embedded == len(chunks) > 40
    docs = engine.embed([t for _, _, t in chunks])  # vocabulary-wide weights
    for query, hits in zip(QUERIES, search(store, embedder, QUERIES, k=10), strict=True):
        scores = docs @ engine.embed([query])[0]
        order = np.argsort(-scores, kind="stable")[:10]
        assert [(h.doc_id, h.chunk_idx) for h in hits] == [chunks[i][:2] for i in order]
        np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-4)


def test_hybrid_rrf_equals_rrf_written_here(engines: tuple[Engine, Engine], store: Store) -> None:
    dense_engine, sparse_engine = engines
    embedder = HybridEmbedder(
        EngineEmbedder(dense_engine, "minilm"), SparseEmbedder(EngineEmbedder(sparse_engine, "s"))
    )
    index_documents(DOCS, embedder, store, Chunker(dense_engine.tokenizer, 64, 0), progress=False)
    chunks = _chunks(dense_engine)
    texts = [t for _, _, t in chunks]
    dense_docs, sparse_docs = dense_engine.embed(texts), sparse_engine.embed(texts)
    depth = len(chunks)  # every chunk in both rankings: the fusion is exact
    found = search(store, embedder, QUERIES, k=10, fusion=Fusion.parse("rrf"), depth=depth)
    dense_only = search(store, embedder, QUERIES, k=10, fusion=Fusion.parse("weighted:1,0"), depth=depth)
    for q, hits, dense_hits in zip(QUERIES, found, dense_only, strict=True):
        fused = np.zeros(len(chunks))
        for scores in (dense_docs @ dense_engine.embed([q])[0], sparse_docs @ sparse_engine.embed([q])[0]):
            ranks = np.empty(len(chunks), dtype=int)
            ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(chunks) + 1)
            fused += 1.0 / (60 + ranks)
        want = np.sort(fused)[::-1][:10]
        np.testing.assert_allclose([h.score for h in hits], want, rtol=1e-5)
        index = {c[:2]: i for i, c in enumerate(chunks)}
        np.testing.assert_allclose([fused[index[(h.doc_id, h.chunk_idx)]] for h in hits], want, rtol=1e-5)
        cosine = dense_docs @ dense_engine.embed([q])[0]
        assert [index[(h.doc_id, h.chunk_idx)] for h in dense_hits] == list(
            np.argsort(-cosine, kind="stable")[:10]
        )


def test_cli_sparse_and_hybrid_and_their_refusals(
    splade: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n" for d in DOCS[:4]))
    db = ["--store", str(tmp_path / "s.db")]
    chunking = ["--max-tokens", "64", "--overlap", "0"]
    assert main(["index", str(docs), *db, *chunking, "--model", str(splade), "--sparse"]) == 0
    assert main(["search", "raise an exception", *db, "--model", str(splade), "--sparse", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])
    hybrid = ["--model", str(minilm_dir()), "--sparse-model", str(splade)]
    db = ["--store", str(tmp_path / "h.db")]
    assert main(["index", str(docs), *db, *chunking, *hybrid, "--hybrid"]) == 0
    for fusion in ("rrf", "weighted:0.7,0.3"):
        assert main(["search", "raise an exception", *db, *hybrid, "--hybrid", fusion, "--json"]) == 0
        assert len(json.loads(capsys.readouterr().out.splitlines()[-1])) == 10
    # the fused top 20 reranked by a cross-encoder: its scores, best first, top 5
    reranker = build_cross_encoder(tmp_path / "ce")
    rerank = ["--rerank", f"engine:{reranker}", "--rerank-depth", "20", "-k", "5"]
    assert main(["search", "raise an exception", *db, *hybrid, "--hybrid", "rrf", *rerank, "--json"]) == 0
    top = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert main(["search", "raise an exception", *db, *hybrid, "--hybrid", "rrf", "-k", "20", "--json"]) == 0
    fused = json.loads(capsys.readouterr().out.splitlines()[-1])
    with Engine.from_pretrained(reranker) as ce:
        results = ce.rerank("raise an exception", [h["text"] for h in fused])
    scores = [r.relevance_score for r in sorted(results, key=lambda r: r.index)]
    order = sorted(range(len(fused)), key=lambda i: (-scores[i], i))[:5]
    assert [(h["doc_id"], h["chunk_idx"]) for h in top] == [
        (fused[i]["doc_id"], fused[i]["chunk_idx"]) for i in order
    ]
    np.testing.assert_allclose([h["score"] for h in top], [scores[i] for i in order], rtol=1e-5)
    refusals = [
        (
            ["index", str(docs), *db, *chunking, "--model", str(minilm_dir()), "--sparse"],
            "gives dense vectors only",
        ),
        (["index", str(docs), *db, *chunking, "--hybrid"], "--sparse-model DIR"),
        (["index", str(docs), *db, *chunking, *hybrid], "add --hybrid"),
        (["search", "x", *db, *hybrid, "--hybrid", "max"], "expected rrf or weighted"),
        (["search", "x", *db, "--hybrid", "rrf"], "gives dense vectors only"),
        (["search", "x", *db, *hybrid, "--hybrid", "weighted:2,1"], "weights in [0, 1]"),
        (["index", str(docs), *db, *chunking, "--model", str(splade)], "is a SPLADE model"),
        (["search", "x", *db, *hybrid, "--hybrid", "rrf", "--rerank", "nope:x"], "nope"),
    ]
    for argv, words in refusals:
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv


def test_late_chunking_does_not_combine_with_sparse(engines: tuple[Engine, Engine]) -> None:
    _, engine = engines
    with pytest.raises(StoreError, match="late chunking"):
        SparseEmbedder(EngineEmbedder(engine, "splade", late=True))


@pytest.mark.slow  # CI time (2026-12-07): hybrid indexes stay in CI through the CLI and RRF tests
def test_a_hybrid_shadow_index_is_compared_with_a_dense_live_one(
    engines: tuple[Engine, Engine], store: Store
) -> None:
    from embedserve.index.migrate import shadow_report
    from embedserve.index.store import SHADOW

    dense_engine, sparse_engine = engines
    chunker = Chunker(dense_engine.tokenizer, 64, 0)
    live = EngineEmbedder(dense_engine, "minilm")
    hybrid = HybridEmbedder(
        EngineEmbedder(dense_engine, "minilm"), SparseEmbedder(EngineEmbedder(sparse_engine, "s"))
    )
    index_documents(DOCS, live, store, chunker, progress=False)
    index_documents(DOCS, hybrid, store, chunker, role=SHADOW, progress=False)
    queries = {f"q{i}": q for i, q in enumerate(QUERIES)}
    report = shadow_report(store, live, hybrid, queries, None, depth=5)
    fused = search(store, hybrid, QUERIES, k=200, role=SHADOW, fusion=Fusion.parse("rrf"), depth=200)

    assert report["top10"]["shadow"] == {f"q{i}": rank_documents(h, 5) for i, h in enumerate(fused)}
    assert report["shadow"]["model"] == "minilm+s" and report["live"]["model"] == "minilm"


QUERY_M3 = topic("assert")[:300]  # the tiny random model's lexical weights of a short query are all 0


def test_bge_m3_gives_both_sides_of_a_hybrid_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One model, both vectors: `index --hybrid` without --sparse-model on BGE-M3 stores its CLS
    vectors and its lexical weights; the sparse side's top 10 equals a brute force over them."""
    from tests.helpers.tiny_sparse import build_bge_m3

    m3 = build_bge_m3(tmp_path / "m3")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n" for d in DOCS[:4]))
    db = ["--store", str(tmp_path / "m3.db"), "--model", str(m3)]
    assert main(["index", str(docs), *db, "--max-tokens", "64", "--overlap", "0", "--hybrid"]) == 0
    assert main(["search", "raise an exception", *db, "--hybrid", "rrf", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])) == 10
    store = Store(str(tmp_path / "m3.db"))
    try:
        with Engine.from_pretrained(m3) as engine:
            embedder = SparseEmbedder(EngineEmbedder(engine, "m3"))
            chunker = Chunker(engine.tokenizer, 64, 0)
            chunks = [(d.doc_id, i, c.text) for d in DOCS[:4] for i, c in enumerate(chunker.split(d.text))]
            weights = embed_lexical(engine, [t for _, _, t in chunks])
            query = embed_lexical(engine, [QUERY_M3])[0]
            collection = store.resolve("live")
            hits = store.search(collection, embedder.embed_queries([QUERY_M3]), 10, field="sparse")[0]
    finally:
        store.close()
    scores = weights @ query
    order = [i for i in np.argsort(-scores, kind="stable")[:10] if scores[i] > 0]  # the sparse search's
    assert len(order) >= 3 and [(h.doc_id, h.chunk_idx) for h in hits] == [chunks[i][:2] for i in order]
    np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-4)
