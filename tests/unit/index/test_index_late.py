"""`embedserve index --late-chunking`: windows of whole chunks within the model's input, one
late-chunked request per window, vectors equal to the engine's late chunks, an index of its own
schema, reruns that embed nothing and edits that re-embed their window."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.cli import main
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import load_tokenizer
from embedserve.index.errors import StoreError
from embedserve.index.late import late_windows
from embedserve.index.pipeline import index_documents
from embedserve.index.store import Store, collection_name
from tests.helpers.engine_calls import embed_late
from tests.helpers.index_fakes import WordEmbedder
from tests.helpers.real_text import topic
from tests.helpers.tiny_models import qwen_tokenizer_dir

DOCS = [
    Document(f"doc-{i}", " ".join(f"Sentence {j} of document {i} is about topic {i % 3}." for j in range(12)))
    for i in range(4)
]


def _vectors(store: Store, collection: str, doc_id: str) -> dict[int, np.ndarray]:
    """A document's stored vectors by chunk index."""
    store.rows(collection)  # loads the collection
    found = store.client.query(
        collection, filter=f'doc_id == "{doc_id}"', output_fields=["chunk_idx", "vector"]
    )
    return {int(r["chunk_idx"]): np.asarray(r["vector"], dtype=np.float32) for r in found}


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(load_tokenizer(qwen_tokenizer_dir()), 32, 0)


def test_windows_hold_whole_consecutive_chunks_within_the_budget(chunker: Chunker) -> None:
    text = DOCS[0].text
    chunks = chunker.split(text)
    counts = [chunker.count(c.text) for c in chunks]
    placed = late_windows(text, chunks, chunker.count, 70)
    windows = list(dict.fromkeys(w for w, _ in placed))
    assert len(windows) > 1
    for w in windows:
        members = [i for i, (x, _) in enumerate(placed) if x is w]
        assert members == list(range(members[0], members[-1] + 1))  # consecutive
        assert sum(counts[i] for i in members) <= 70
        assert [w.text[a:b] for a, b in w.spans] == [chunks[i].text for i in members]


def test_windows_count_the_gaps_between_chunks(chunker: Chunker) -> None:
    """Chunks are stripped: the text between them (paragraph breaks, double spaces) is a token
    of its own in byte-level BPE, and a window packed on the chunks' counts alone runs over."""
    text = "\n\n".join(f"Paragraph {i}.  It has words, more words and a list:\n- item {i}" for i in range(40))
    chunks = chunker.split(text)
    for budget in (40, 64, 100, 250):
        windows = list(dict.fromkeys(w for w, _ in late_windows(text, chunks, chunker.count, budget)))
        assert all(chunker.count(w.text) <= budget for w in windows)
        assert sum(len(w.spans) for w in windows) == len(chunks)
    packed = list(dict.fromkeys(w for w, _ in late_windows(text, chunks, chunker.count, 250)))
    assert max(chunker.count(w.text) for w in packed) > 200  # packed close to the limit, not far below


def test_index_stores_each_chunk_as_its_window_row_and_reruns_embed_nothing(
    store: Store, chunker: Chunker
) -> None:
    emb = WordEmbedder(chunker.tokenizer, late=True)
    emb.max_tokens = 72  # windows of ~2 chunks
    stats = index_documents(DOCS, emb, store, chunker, progress=False)
    collection = collection_name(emb.meta.embedding_schema)
    assert stats.embedded == stats.chunks == len(store.rows(collection)) and emb.embedded == []  # none alone
    text = DOCS[1].text
    chunks = chunker.split(text)
    budget = 72 - chunker.tokenizer.num_special
    placed = late_windows(text, chunks, chunker.count, budget)
    stored = _vectors(store, collection, "doc-1")
    for i, (window, pos) in enumerate(placed):
        want = emb.embed_late_documents([(window.text, list(window.spans))])[0][pos]
        assert np.allclose(stored[i], want, atol=1e-6)
    n_windows = len(emb.windows)
    again = WordEmbedder(chunker.tokenizer, late=True)
    again.max_tokens = 72
    assert index_documents(DOCS, again, store, chunker, progress=False).embedded == 0
    # an edit in one chunk re-embeds its window's chunks, and nothing else
    edited = [*DOCS[:2], Document("doc-2", DOCS[2].text.replace("Sentence 0 ", "Phrase 0 ")), DOCS[3]]
    third = WordEmbedder(chunker.tokenizer, late=True)
    third.max_tokens = 72
    stats = index_documents(edited, third, store, chunker, progress=False)
    (window,) = third.windows  # the first window of doc-2 (its boundaries did not move)
    assert window.startswith("Phrase 0 ") and stats.embedded == stats.chunks - stats.skipped > 1
    assert stats.embedded < len(chunker.split(DOCS[2].text)) < stats.chunks  # not the whole document
    assert n_windows > 4


def test_overlapping_chunks_are_refused(store: Store) -> None:
    emb = WordEmbedder(load_tokenizer(qwen_tokenizer_dir()), late=True)
    with pytest.raises(StoreError, match="--overlap 0"):
        index_documents(DOCS, emb, store, Chunker(emb.tokenizer, 32, 4), progress=False)  # type: ignore[arg-type]


def test_cli_index_and_search_with_late_chunking(
    qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json.dumps({"id": n, "text": topic(n)}) + "\n" for n in ("assert", "pass", "del"))
    )
    db = str(tmp_path / "late.db")
    common = ["--store", db, "--model", str(qwen3_dir), "--max-model-len", "256"]
    assert main(["index", str(docs), *common, "--max-tokens", "64", "--overlap", "0", "--late-chunking"]) == 0
    assert main(["search", "the assert statement", *common, "--late-chunking", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert hits and {"doc_id", "chunk_idx", "score", "text"} <= set(hits[0])
    assert main(["search", "the assert statement", *common]) == 2  # the plain schema is refused
    assert "--late-chunking" in capsys.readouterr().err
    # the stored vectors are the engine's late chunks of each window
    store = Store(db)
    try:
        stored = _vectors(store, store.resolve("live"), "pass")
    finally:
        store.close()
    with Engine.from_pretrained(qwen3_dir, max_model_len=256) as engine:
        chunker = Chunker(engine.tokenizer, 64, 0)
        text = topic("pass")
        chunks = chunker.split(text)
        placed = late_windows(text, chunks, chunker.count, 256 - 1)
        for i, (window, pos) in enumerate(placed):
            want = embed_late(engine, window.text, chunk_spans=[list(s) for s in window.spans]).embeddings[
                pos
            ]
            assert np.allclose(stored[i], want, atol=1e-5)


def test_an_endpoint_embeds_late_windows_as_the_engine_does(qwen3_dir: Path) -> None:
    from embedserve.index.engine_embedder import EngineEmbedder
    from embedserve.index.http_embedder import HttpEmbedder
    from tests.helpers.fuzz import threaded_server
    from tests.helpers.inprocess import server_client

    windows = [(topic("assert")[:600], [(0, 250), (250, 600)]), ("One. Two.", [(0, 4), (4, 9)])]
    with server_client(qwen3_dir) as c, threaded_server(c.app) as base:
        http = HttpEmbedder(base, late=True)
        try:
            got = http.embed_late_documents(windows)
            query = http.embed_queries(["what does assert do"])  # plain requests, their own schema
        finally:
            http.close()
    with Engine.from_pretrained(qwen3_dir) as engine:
        local = EngineEmbedder(engine, "qwen3", late=True)
        want = local.embed_late_documents(windows)
        plain = EngineEmbedder(engine, "qwen3")
        assert plain.meta.embedding_schema != local.meta.embedding_schema
        assert np.allclose(query, local.embed_queries(["what does assert do"]), atol=1e-6)
    assert http.meta.embedding_schema == local.meta.embedding_schema
    for g, w in zip(got, want, strict=True):
        assert g.shape == (2, 64) and np.allclose(g, w, atol=1e-6)
