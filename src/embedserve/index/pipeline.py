"""document -> chunks -> vectors -> store, resumable and idempotent.

A chunk's id is a hash of (embedding_schema, doc_id, chunk_idx): the same chunk embedded by the
same vector space always lands on the same row. A run first reads what the collection holds
(id -> text hash), embeds only chunks that are missing or whose text changed, and upserts
them; so a rerun of a finished run embeds nothing, a run killed halfway resumes where its
last written batch ended, and no chunk is ever stored twice. Rows of a re-chunked document
beyond its new last chunk are deleted, so a shorter document leaves no stale tail.

The stages work on column batches (dict of arrays), the format Ray Data passes between
stages, so `ray_runner` runs exactly these functions on a cluster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import Embedder, VectorMeta
from embedserve.index.errors import SchemaMismatchError, StoreError
from embedserve.index.late import check_late_chunker, embed_late_rows, late_windows
from embedserve.index.multivector import by_chunk, token_rows
from embedserve.index.sparse import DENSE, SPARSE, vector_sources
from embedserve.index.store import LIVE, MAX_TEXT_BYTES, SHADOW, Store, StoredChunk

Batch = dict[str, np.ndarray]


def chunk_id(schema: str, doc_id: str, chunk_idx: int) -> str:
    return hashlib.sha256(f"{schema}\0{doc_id}\0{chunk_idx}".encode()).hexdigest()[:32]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def chunk_stage(docs: Batch, chunker: Chunker, schema: str, late_budget: int | None = None) -> Batch:
    """Columns doc_id, text -> one row per chunk: id, doc_id, chunk_idx, last_idx, text, text_hash;
    with `late_budget` (late chunking: content tokens per window) also window and window_pos,
    and a text hash over the chunk's window (index/late.py)."""
    names = ["id", "doc_id", "chunk_idx", "last_idx", "text", "text_hash"]
    cols: dict[str, list[Any]] = {k: [] for k in names + (["window", "window_pos"] if late_budget else [])}
    for doc_id, text in zip(docs["doc_id"], docs["text"], strict=True):
        chunks = chunker.split(str(text))
        placed = None if late_budget is None else late_windows(str(text), chunks, chunker.count, late_budget)
        for idx, chunk in enumerate(chunks):
            if len(chunk.text.encode()) > MAX_TEXT_BYTES:
                raise StoreError(
                    f"document {doc_id} chunk {idx} holds more than {MAX_TEXT_BYTES} bytes of text, the "
                    "store's limit per row: lower --max-tokens"
                )
            cols["id"].append(chunk_id(schema, str(doc_id), idx))
            cols["doc_id"].append(str(doc_id))
            cols["chunk_idx"].append(idx)
            cols["last_idx"].append(len(chunks) - 1)
            cols["text"].append(chunk.text)
            if placed is None:
                cols["text_hash"].append(text_hash(chunk.text))
                continue
            window, pos = placed[idx]
            cols["window"].append(window)
            cols["window_pos"].append(pos)
            cols["text_hash"].append(text_hash(f"{chunk.text}\0late\0{window.text}"))
    out = {k: np.asarray(v, dtype=object) for k, v in cols.items()}
    out["chunk_idx"] = np.asarray(cols["chunk_idx"], dtype=np.int64)
    out["last_idx"] = np.asarray(cols["last_idx"], dtype=np.int64)
    if late_budget is not None:
        out["window_pos"] = np.asarray(cols["window_pos"], dtype=np.int64)
    return out


def embed_stage(chunks: Batch, embedder: Embedder, stored_hashes: Mapping[str, str]) -> Batch:
    """Adds each vector field (`vector` [n, dim]; `sparse`: {id: weight} rows, index/sparse.py)
    and `embedded`: chunks already stored with the same text are not embedded (zero or empty
    vectors, embedded False) but still pass on, so the writer sees every chunk."""
    n = len(chunks["id"])
    todo = [i for i in range(n) if stored_hashes.get(chunks["id"][i]) != chunks["text_hash"][i]]
    texts = [str(chunks["text"][i]) for i in todo]
    out = dict(chunks)
    for field, source in vector_sources(embedder).items():
        if field == SPARSE:
            rows = np.empty(n, dtype=object)
            rows[:] = [{} for _ in range(n)]
            for i, row in zip(todo, source.embed_documents(texts) if todo else [], strict=True):
                rows[i] = row
            out[field] = rows
            continue
        if getattr(source, "multivector", False):  # each chunk's [tokens, dim] (index/multivector.py)
            matrices = np.empty(n, dtype=object)
            matrices[:] = [np.zeros((0, source.dimension), dtype=np.float32) for _ in range(n)]
            for i, m in zip(todo, source.embed_documents(texts) if todo else [], strict=True):
                matrices[i] = m
            out[field] = matrices
            continue
        vectors = np.zeros((n, source.dimension), dtype=np.float32)
        if todo and "window" in chunks:  # late chunking: each chunk's row of its window's request
            vectors[todo] = embed_late_rows(chunks, todo, source)
        elif todo and source.late:
            raise StoreError("a late-chunking embedder needs its chunks' windows (chunk_stage's late_budget)")
        elif todo:
            vectors[todo] = source.embed_documents(texts)
        out[field] = vectors
    embedded = np.zeros(n, dtype=bool)
    embedded[todo] = True
    return {**out, "embedded": embedded}


@dataclass
class IndexStats:
    collection: str
    documents: int = 0
    chunks: int = 0
    embedded: int = 0
    skipped: int = 0
    deleted_stale: int = 0
    rows: int = 0


class Writer:
    """Writes embedded rows with their metadata, then removes stale tails and flushes."""

    def __init__(
        self,
        store: Store,
        collection: str,
        meta: VectorMeta,
        stored: Mapping[str, StoredChunk],
        bar: tqdm[Any],
        token_rows: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.store = store
        self.collection = collection
        self.meta = meta.fields()
        self.stored = stored
        # A multi-vector index: each chunk's stored token row ids (index/multivector.py).
        self.token_rows = token_rows
        self.bar = bar
        self.last_idx: dict[str, int] = {}
        self.stats = IndexStats(collection)

    def write(self, batch: Batch) -> None:
        rows, stale, embedded = [], [], 0
        for i in range(len(batch["id"])):
            self.last_idx[str(batch["doc_id"][i])] = int(batch["last_idx"][i])
            if not batch["embedded"][i]:
                continue
            embedded += 1
            vectors = {f: batch[f][i] for f in (DENSE, SPARSE) if f in batch}
            row = {
                "id": str(batch["id"][i]),
                **{f: v if f == SPARSE else v.tolist() for f, v in vectors.items()},
                "doc_id": str(batch["doc_id"][i]),
                "chunk_idx": int(batch["chunk_idx"][i]),
                "text": str(batch["text"][i]),
                "text_hash": str(batch["text_hash"][i]),
                **self.meta,
            }
            if self.token_rows is None:
                rows.append(row)
                continue
            tokens = token_rows(row, vectors[DENSE])
            rows += tokens
            stale += self.token_rows.get(row["id"], [])[len(tokens) :]  # the chunk's old extra tokens
        self.store.upsert(self.collection, rows)
        self.store.delete(self.collection, stale)
        n = len(batch["id"])
        self.stats.chunks += n
        self.stats.embedded += embedded
        self.stats.skipped += n - embedded
        self.bar.update(n)

    def finish(self) -> IndexStats:
        stale = [
            cid
            for cid, s in self.stored.items()
            if s.doc_id in self.last_idx and s.chunk_idx > self.last_idx[s.doc_id]
        ]
        if self.token_rows is not None:  # a multi-vector index: every token row of those chunks
            stale = [rid for cid in stale for rid in self.token_rows.get(cid, [])]
        self.store.delete(self.collection, stale)
        # Unflushed rows sit in a growing segment that is searched slowly: seal after bulk loads.
        self.store.flush(self.collection)
        self.bar.close()
        self.stats.documents = len(self.last_idx)
        self.stats.deleted_stale = len(stale)
        self.stats.rows = self.store.count(self.collection)
        return self.stats


def open_collection(
    store: Store, meta: VectorMeta, dimension: int, role: str, fields: Sequence[str] = (DENSE,)
) -> str:
    """The collection of `meta`'s schema, after checking it may serve `role`.

    `live` (plain indexing) must already serve this schema or not exist yet: adding vectors of
    another model next to the live index is what `migrate build` is for. `shadow` must differ
    from `live`, or there is nothing to migrate."""
    schema = meta.embedding_schema
    live = store.aliases().get(LIVE)
    if live is not None:
        live_schema = store.schema_of(live)
        if role == LIVE and live_schema != schema:
            raise SchemaMismatchError(
                "refusing to index into the live index",
                live_schema,
                schema,
                "If it was built with other options (--late-chunking, --sparse, --sparse-model, "
                "--dimensions, --embedding-type), pass the same; to move the store to this model, build a "
                "shadow index: "
                "`embedserve migrate build`.",
            )
        if role == SHADOW and live_schema == schema:
            raise StoreError(
                f"the live index already has this embedder's schema {schema}; nothing to migrate"
            )
    return store.ensure_collection(meta, dimension, fields)


DEFAULT_CHUNK_TOKENS = 512


def chunk_tokens(requested: int | None, model_limit: int | None) -> int:
    """Tokens per chunk: as requested, else 512 capped at the model's input limit."""
    if requested is not None:
        return requested
    return min(DEFAULT_CHUNK_TOKENS, model_limit or DEFAULT_CHUNK_TOKENS)


def check_chunk_limit(chunker: Chunker, max_tokens: int | None) -> None:
    if max_tokens is not None and chunker.max_tokens > max_tokens:
        raise StoreError(
            f"--max-tokens {chunker.max_tokens} exceeds the model's input limit of {max_tokens} tokens"
        )


def as_columns(docs: Sequence[Document]) -> Batch:
    return {
        "doc_id": np.asarray([d.doc_id for d in docs], dtype=object),
        "text": np.asarray([d.text for d in docs], dtype=object),
    }


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    return {k: v[start:stop] for k, v in batch.items()}


def index_documents(
    docs: Iterable[Document],
    embedder: Embedder,
    store: Store,
    chunker: Chunker,
    role: str = LIVE,
    batch_size: int = 128,
    progress: bool | None = None,
) -> IndexStats:
    """Index `docs` in this process; `role` is pointed at the collection once it is complete."""
    check_chunk_limit(chunker, embedder.max_tokens)
    late_budget = None
    if embedder.late:
        check_late_chunker(chunker.overlap)
        limit = embedder.max_tokens or chunker.max_tokens
        late_budget = limit - chunker.tokenizer.num_special - embedder.late_prompt_tokens
    fields = tuple(vector_sources(embedder))
    collection = open_collection(store, embedder.meta, embedder.dimension, role, fields)
    stored = store.stored_chunks(collection)
    tokens = None
    if getattr(embedder, "multivector", False):  # token rows, read as their chunks
        stored, tokens = by_chunk(stored)
    hashes = {cid: s.text_hash for cid, s in stored.items()}
    chunks = chunk_stage(as_columns(list(docs)), chunker, embedder.meta.embedding_schema, late_budget)
    n = len(chunks["id"])
    # progress=None: a bar only on a terminal (tqdm's own rule).
    bar = tqdm(total=n, unit="chunk", desc="indexing", disable=None if progress is None else not progress)
    writer = Writer(store, collection, embedder.meta, stored, bar, tokens)
    for start in range(0, n, batch_size):
        writer.write(embed_stage(slice_batch(chunks, start, start + batch_size), embedder, hashes))
    stats = writer.finish()
    store.point(role, collection)
    return stats
