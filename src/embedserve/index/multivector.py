"""Multi-vector indexes (`index --multivector`, `search --multivector`): a ColBERT-style model's
token vectors, searched by MaxSim.

Milvus Lite (3.2) has no field for a list of vectors (its schema refuses an array of vector
structs), so each chunk is stored as token rows of the usual collection, one per vector:

    id = <chunk id>.<token index>   vector (COSINE)   doc_id   chunk_idx   text (token 0 only)

A search runs each query vector's top `depth` token rows (the ANN stage, `--filter` applied
there), gathers their chunks, reads every token vector of those chunks and ranks them by exact
MaxSim (each query vector's best dot product with a chunk vector, summed). A re-embedded chunk
replaces its token rows (fewer tokens: the rest deleted); a shortened document's tail chunks
lose all theirs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.embedders.engine import EngineSource, open_engine
from embedserve.engine.ask import Ask, answers_as
from embedserve.engine.engine import EmbeddingOutput
from embedserve.engine.multivector import maxsim
from embedserve.engine.options import EngineOptions
from embedserve.index.embedder import VectorMeta
from embedserve.index.errors import StoreError
from embedserve.index.store import Hit, Store, StoredChunk
from embedserve.pooling.outputs import Output
from embedserve.schema import multivector_type
from embedserve.tokenizer import Tokenizer

TOKEN_SEP = "."


class MultiVectorEmbedder:
    """A multi-vector model in this process: chunks on the document side, queries on the query
    side (a query longer than its side's limit is cut, as sentence-transformers cuts it)."""

    multivector = True

    def __init__(
        self, source: EngineSource, name: str, model_version: str | None, dimensions: int | None
    ) -> None:
        self.source, self.engine = source, source.engine
        if Output.MULTIVECTOR not in self.engine.outputs:
            raise StoreError(
                f"--multivector stores a multi-vector model's token vectors: {name} gives one vector per "
                "input (a ColBERT directory, or BGE-M3 with its colbert_linear.pt, does not)"
            )
        head = self.engine.multivector_head
        assert head is not None
        self.engine.renderer.check_vector_dimensions(dimensions)
        self.dimensions = dimensions
        self.dimension = dimensions or head.dim
        meta = source.metadata(name, model_version)
        self.meta = VectorMeta(**meta.fields(self.dimension, head.normalize, multivector_type("float")))
        self.tokenizer: Tokenizer | None = self.engine.tokenizer
        # A chunk's content tokens: the document side's limit less its prompt and special tokens.
        overhead = len(self.engine.renderer.multivector("x", "document")[0].tokenized.token_ids) - 1
        self.max_tokens: int | None = (
            head.side_limit("document", self.engine.config.scheduler.max_model_len) - overhead
        )
        self.late = False
        self.late_prompt_tokens = 0

    @classmethod
    def load(
        cls,
        model: str | Path,
        options: EngineOptions,
        name: str | None,
        version: str | None,
        dims: int | None,
    ) -> MultiVectorEmbedder:
        source = EngineSource(open_engine(model, options), options)
        try:
            return cls(source, name or Path(model).name, version, dims)
        except BaseException:
            source.close()
            raise

    def _embed(self, texts: list[str], side: str, truncate: str) -> list[np.ndarray]:
        if not texts:
            return []
        priority = "batch" if side == "document" else "online"
        ask = Ask(Output.MULTIVECTOR, dimensions=self.dimensions, priority=priority, truncate=truncate)
        answers = self.engine.run(texts, replace(ask, side=side))
        return [o.embedding for o in answers_as(answers, EmbeddingOutput)]

    def embed_documents(self, texts: list[str]) -> list[np.ndarray]:
        return self._embed(texts, "document", "error")

    def embed_queries(self, texts: list[str]) -> list[np.ndarray]:
        return self._embed(texts, "query", "end")

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        raise StoreError(
            "late chunking pools chunks into one vector each: it does not combine with --multivector"
        )

    def close(self) -> None:
        self.source.close()


def token_id(chunk_id: str, t: int) -> str:
    return f"{chunk_id}{TOKEN_SEP}{t:05d}"


def by_chunk(stored: Mapping[str, StoredChunk]) -> tuple[dict[str, StoredChunk], dict[str, list[str]]]:
    """Token rows as their chunks (chunk id -> its hash, doc, index) and each chunk's row ids in
    token order."""
    chunks: dict[str, StoredChunk] = {}
    rows: dict[str, list[str]] = {}
    for rid in sorted(stored):
        cid = rid.rsplit(TOKEN_SEP, 1)[0]
        chunks[cid] = stored[rid]
        rows.setdefault(cid, []).append(rid)
    return chunks, rows


def token_rows(row: dict[str, Any], vectors: np.ndarray) -> list[dict[str, Any]]:
    """A chunk's row as one row per token vector (its text on the first only)."""
    return [
        {**row, "id": token_id(row["id"], t), "vector": v.tolist(), "text": row["text"] if t == 0 else ""}
        for t, v in enumerate(vectors)
    ]


def maxsim_search(
    store: Store, collection: str, queries: list[np.ndarray], k: int, filter_expr: str, depth: int
) -> list[list[Hit]]:
    """Top-k chunks per query by exact MaxSim over the chunks the ANN stage found."""
    out = []
    for query in queries:
        found = store.search(collection, query, depth, filter_expr, with_text=False)
        docs = sorted({h.doc_id for hits in found for h in hits})
        keys = {(h.doc_id, h.chunk_idx) for hits in found for h in hits}
        vectors: dict[tuple[str, int], list[tuple[str, list[float]]]] = {}
        texts: dict[tuple[str, int], str] = {}
        quoted = ", ".join(json.dumps(d, ensure_ascii=False) for d in docs)  # Milvus reads no \u escapes
        quoted += "] and chunk_idx in [" + ", ".join(str(i) for i in sorted({i for _, i in keys}))
        for r in store.rows(
            collection, f"doc_id in [{quoted}]", ("id", "doc_id", "chunk_idx", "text", "vector")
        ):
            key = (r["doc_id"], int(r["chunk_idx"]))
            if key in keys:
                vectors.setdefault(key, []).append((r["id"], r["vector"]))
                if r["text"]:
                    texts[key] = r["text"]
        scored = [
            (maxsim(query, np.array([v for _, v in sorted(rows)], dtype=np.float32)), key)
            for key, rows in vectors.items()
        ]
        scored.sort(key=lambda s: (-s[0], s[1]))
        out.append([Hit(doc, idx, score, texts.get((doc, idx), "")) for score, (doc, idx) in scored[:k]])
    return out
