"""Pipeline + Milvus Lite with a bag-of-words embedder: idempotence, resume, stale tails,
schema refusals, search."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.errors import InvalidInputError
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import load_tokenizer
from embedserve.index.errors import SchemaMismatchError, StoreError
from embedserve.index.pipeline import chunk_id, index_documents
from embedserve.index.search import search
from embedserve.index.store import LIVE, META_FIELDS, SHADOW, Store, collection_name
from tests.helpers.index_fakes import WordEmbedder
from tests.helpers.tiny_models import qwen_tokenizer_dir

TOPICS = ["wing flutter", "boundary layer", "shock wave", "heat transfer", "jet noise", "rotor blade"]


def _doc(i: int, sentences: int) -> Document:
    topic = TOPICS[i % len(TOPICS)]
    body = " ".join(f"Sentence {j} of document {i} discusses {topic} at length." for j in range(sentences))
    return Document(f"doc-{i}", body)


DOCS = [_doc(i, 2 + 3 * (i % 4)) for i in range(12)]


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(load_tokenizer(qwen_tokenizer_dir()), 48, 8)


def _expected(chunker: Chunker, docs: list[Document], schema: str) -> set[tuple[str, int, str]]:
    return {
        (chunk_id(schema, d.doc_id, i), i, d.doc_id) for d in docs for i in range(len(chunker.split(d.text)))
    }


def _rows(store: Store, schema: str) -> list[dict[str, object]]:
    return store.rows(collection_name(schema))


def _keys(rows: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return sorted((r["id"], r["chunk_idx"], r["doc_id"]) for r in rows)


def test_index_writes_every_chunk_once_with_metadata(store: Store, chunker: Chunker) -> None:
    emb = WordEmbedder(chunker.tokenizer)
    stats = index_documents(DOCS, emb, store, chunker, progress=False)
    expected = _expected(chunker, DOCS, emb.meta.embedding_schema)
    rows = _rows(store, emb.meta.embedding_schema)
    assert _keys(rows) == sorted(expected)
    assert stats.chunks == stats.embedded == stats.rows == len(expected) > len(DOCS)
    for r in rows:
        assert {k: r[k] for k in META_FIELDS} == emb.meta.fields()
    collection = collection_name(emb.meta.embedding_schema)
    assert store.aliases() == {LIVE: collection}
    info = store.client.describe_collection(collection)
    assert info["properties"]["embedding_schema"] == emb.meta.embedding_schema
    assert store.schema_of(collection) == emb.meta.embedding_schema

    again = WordEmbedder(chunker.tokenizer)
    stats = index_documents(DOCS, again, store, chunker, progress=False)
    assert again.embedded == [] and stats.skipped == len(expected) and stats.rows == len(expected)


def test_changed_and_shortened_documents(store: Store, chunker: Chunker) -> None:
    index_documents(DOCS, WordEmbedder(chunker.tokenizer), store, chunker, progress=False)
    long_doc = max(DOCS, key=lambda d: len(d.text))
    changed = [Document(d.doc_id, d.text[: len(d.text) // 3]) if d is long_doc else d for d in DOCS]
    emb = WordEmbedder(chunker.tokenizer)
    stats = index_documents(changed, emb, store, chunker, progress=False)
    new_chunks = [c.text for c in chunker.split(changed[DOCS.index(long_doc)].text)]
    assert emb.embedded == new_chunks[-1:]  # earlier chunks kept their text; the cut one changed
    assert stats.deleted_stale == len(chunker.split(long_doc.text)) - len(new_chunks) > 0
    assert _keys(_rows(store, emb.meta.embedding_schema)) == sorted(
        _expected(chunker, changed, emb.meta.embedding_schema)
    )


class FailingEmbedder(WordEmbedder):
    """Dies on its n-th batch, as a killed indexer would."""

    def __init__(self, *args: object, fail_at: int) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.calls, self.fail_at = 0, fail_at

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("killed")
        return super().embed_documents(texts)


def test_interrupted_run_resumes_without_gaps_or_duplicates(store: Store, chunker: Chunker) -> None:
    with pytest.raises(RuntimeError, match="killed"):
        index_documents(DOCS, FailingEmbedder(chunker.tokenizer, fail_at=3), store, chunker, batch_size=5)
    schema = WordEmbedder(chunker.tokenizer).meta.embedding_schema
    assert len(_rows(store, schema)) == 10  # two batches of five landed
    assert LIVE not in store.aliases()  # an unfinished index is not served
    emb = WordEmbedder(chunker.tokenizer)
    stats = index_documents(DOCS, emb, store, chunker, batch_size=5, progress=False)
    expected = _expected(chunker, DOCS, schema)
    assert stats.embedded == len(expected) - 10 and stats.skipped == 10
    rows = _rows(store, schema)
    assert len(rows) == len(expected) and _keys(rows) == sorted(expected)


def test_schema_refusals(store: Store, chunker: Chunker) -> None:
    old = WordEmbedder(chunker.tokenizer, "es1-old", "old-model")
    new = WordEmbedder(chunker.tokenizer, "es1-new", "new-model")
    index_documents(DOCS[:3], old, store, chunker, progress=False)
    with pytest.raises(SchemaMismatchError, match=r"es1-old.*es1-new.*migrate build"):
        index_documents(DOCS[:3], new, store, chunker, progress=False)
    with pytest.raises(StoreError, match="nothing to migrate"):
        index_documents(DOCS[:3], old, store, chunker, role=SHADOW, progress=False)
    with pytest.raises(SchemaMismatchError, match=r"refusing to search.*es1-old.*es1-new"):
        search(store, new, ["wing flutter"])
    index_documents(DOCS[:3], new, store, chunker, role=SHADOW, progress=False)
    assert store.aliases() == {LIVE: collection_name("es1-old"), SHADOW: collection_name("es1-new")}
    assert search(store, new, ["wing flutter"], role=SHADOW)[0]


def test_search_finds_the_topic_and_filters(store: Store, chunker: Chunker) -> None:
    emb = WordEmbedder(chunker.tokenizer)
    index_documents(DOCS, emb, store, chunker, progress=False)
    on_topic = [r for r in _rows(store, emb.meta.embedding_schema) if "shock wave" in str(r["text"])]
    [hits] = search(store, emb, ["shock wave"], k=len(on_topic))
    assert len(on_topic) > 1 and all("shock wave" in h.text for h in hits)
    assert hits[0].score >= hits[-1].score
    [only] = search(store, emb, ["shock wave"], k=50, filter_expr='doc_id == "doc-5"')
    assert only and {h.doc_id for h in only} == {"doc-5"}
    with pytest.raises(StoreError, match="search in"):
        search(store, emb, ["x"], filter_expr="doc_id ==")
    with pytest.raises(InvalidInputError, match="k must be"):
        search(store, emb, ["x"], k=0)


def test_empty_store_has_no_live_index(store: Store, chunker: Chunker) -> None:
    with pytest.raises(StoreError, match="no 'live' index"):
        search(store, WordEmbedder(chunker.tokenizer), ["x"])
