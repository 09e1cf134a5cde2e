"""Multi-vector indexes in Milvus Lite: each chunk's token vectors as rows; a search's MaxSim
top-k equals a numpy brute force over every chunk (with a depth that reaches every chunk); a
re-run embeds nothing, a changed document replaces its token rows, a shorter one leaves no
stale tokens; the CLI; the refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embedserve.cli import main
from embedserve.engine.multivector import maxsim
from embedserve.engine.options import EngineOptions
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import EmbedderSpec
from embedserve.index.embedders import build_embedder
from embedserve.index.errors import StoreError
from embedserve.index.multivector import MultiVectorEmbedder
from embedserve.index.pipeline import index_documents
from embedserve.index.search import search
from embedserve.index.store import Store
from tests.helpers.real_text import topic
from tests.helpers.tiny_multivector import build_colbert

TOPICS = ("assert", "pass", "del", "return", "yield", "raise")
DOCS = [Document(name, topic(name)[:1200]) for name in TOPICS[:-1]]
DOCS.append(Document("raisé", topic("raise")[:1200]))  # an id Milvus must read unescaped
QUERIES = ["raise an exception", "leave the loop early", "generator function values"]


@pytest.fixture(scope="module")
def colbert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_colbert(tmp_path_factory.mktemp("colbert-index") / "c")


@pytest.fixture(scope="module")
def embedder(colbert: Path) -> Iterator[MultiVectorEmbedder]:
    e = build_embedder(EmbedderSpec(model=str(colbert), multivector=True))
    assert isinstance(e, MultiVectorEmbedder)
    yield e
    e.close()


def test_maxsim_top_k_equals_a_brute_force(embedder: MultiVectorEmbedder, store: Store) -> None:
    chunker = Chunker(embedder.engine.tokenizer, 64, 0)
    stats = index_documents(DOCS, embedder, store, chunker, progress=False)
    chunks = [(d.doc_id, i, c.text) for d in DOCS for i, c in enumerate(chunker.split(d.text))]
    vectors = embedder.embed_documents([t for _, _, t in chunks])
    assert stats.embedded == len(chunks) > 12 and stats.rows == sum(len(v) for v in vectors)
    assert embedder.max_tokens is not None and 64 <= embedder.max_tokens < 180
    queries = embedder.embed_queries(QUERIES)
    for q, hits in zip(queries, search(store, embedder, QUERIES, k=5, depth=2000), strict=True):
        scores = np.array([maxsim(q, v) for v in vectors])
        order = np.argsort(-scores, kind="stable")[:5]
        assert [(h.doc_id, h.chunk_idx) for h in hits] == [chunks[i][:2] for i in order]
        np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-5)
        assert [h.text for h in hits] == [chunks[i][2] for i in order]
    # a re-run embeds nothing; a changed, shorter document replaces its tokens, no stale rows left
    again = index_documents(DOCS, embedder, store, chunker, progress=False)
    assert again.embedded == 0 and again.rows == stats.rows
    short = [*DOCS[:-1], Document(DOCS[-1].doc_id, "Raise: short now.")]
    third = index_documents(short, embedder, store, chunker, progress=False)
    n_last = len(embedder.embed_documents(["Raise: short now."])[0])
    kept = sum(len(v) for (doc, _, _), v in zip(chunks, vectors, strict=True) if doc != DOCS[-1].doc_id)
    assert third.embedded == 1 and third.rows == kept + n_last
    rows = store.rows(store.resolve("live"), f'doc_id == "{DOCS[-1].doc_id}"')
    assert len(rows) == n_last and {r["chunk_idx"] for r in rows} == {0}


def test_the_cli_and_the_refusals(colbert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for d in DOCS:
        (folder / f"{d.doc_id}.txt").write_text(d.text)
    db = str(tmp_path / "cli.db")
    base = ["--model", str(colbert), "--store", db]
    assert main(["index", *base, "--multivector", "--max-tokens", "64", "--overlap", "0", str(folder)]) == 0
    capsys.readouterr()
    assert main(["search", *base, "--multivector", "--json", "-k", "3", "raise an exception"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 3 and {"doc_id", "chunk_idx", "score", "text"} <= set(hits[0])
    # a ColBERT model without --multivector, and options that do not combine with it
    assert main(["search", *base, "raise"]) != 0
    assert "--multivector" in capsys.readouterr().err
    with pytest.raises(StoreError, match="--late-chunking"):
        build_embedder(EmbedderSpec(model=str(colbert), multivector=True, late_chunking=True))


def test_a_single_vector_model_is_refused(qwen3_dir: Path) -> None:
    with pytest.raises(StoreError, match="gives one vector per input"):
        build_embedder(EmbedderSpec(model=str(qwen3_dir), multivector=True, engine=EngineOptions()))
