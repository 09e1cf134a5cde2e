"""The vector store: Milvus through `pymilvus.MilvusClient`.

A local path (`./embedserve.db`) is embedded Milvus Lite; `http://host:19530` (+ token) is a
Milvus server or cluster; the code is the same. One collection per embedding schema, named
from it, so vectors of two schemas can never share a collection; the schema is also recorded
in the collection's properties and description (Milvus Lite keeps only the properties).
Aliases name the roles: `live` (what search reads), `shadow` (a candidate being evaluated),
`previous` (what `live` pointed at before the last cutover).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.index.embedder import VectorMeta
from embedserve.index.errors import StoreError
from embedserve.pooling.outputs import Output

LIVE, SHADOW, PREVIOUS = "live", "shadow", "previous"
ROLES = (LIVE, SHADOW, PREVIOUS)
SCHEMA_PROPERTY = "embedding_schema"
SPARSE_FIELD = Output.SPARSE.value  # a hybrid collection's sparse vectors
MAX_TEXT_BYTES = 65535  # Milvus VARCHAR limit
# Metadata fields stored on every row beside the vector (see VectorMeta).
META_FIELDS = ("model", "model_version", "dtype", "backend_profile", "embedding_schema")
ROW_FIELDS = ("id", "doc_id", "chunk_idx", "text", "text_hash", *META_FIELDS)
_SCHEMA_IN_DESCRIPTION = re.compile(r"embedding_schema=(\S+)")
_ID_BATCH = 1000


def collection_name(schema: str) -> str:
    """Milvus names allow letters, digits and underscores."""
    return "emb_" + re.sub(r"[^0-9A-Za-z_]", "_", schema)


@dataclass(frozen=True)
class StoredChunk:
    text_hash: str
    doc_id: str
    chunk_idx: int


@dataclass(frozen=True)
class Hit:
    doc_id: str
    chunk_idx: int
    score: float
    text: str
    vector: np.ndarray | None = None  # the stored vector, when the search asked for it


class Store:
    def __init__(self, uri: str, token: str | None = None) -> None:
        from pymilvus import MilvusClient

        # Milvus Lite cannot give the query iterator a server timestamp and pymilvus warns on
        # every read; the client-side timestamp it falls back to is right for us. (Set after
        # the import: pymilvus configures its loggers when imported.)
        logging.getLogger("pymilvus.client.iterator.query_iterator").setLevel(logging.ERROR)
        self.uri = uri
        self.local = "://" not in uri
        if self.local and not uri.endswith(".db"):
            raise StoreError(f"a local (Milvus Lite) store is a path ending in .db, got {uri!r}")
        try:
            self.client = MilvusClient(uri=uri, token=token or "")
        except Exception as e:  # pymilvus raises its own types; say where it failed
            hint = " (is another process using it?)" if self.local else ""
            raise StoreError(f"cannot open the vector store {uri}{hint}: {e}") from None
        self._loaded: set[str] = set()

    def close(self) -> None:
        self.client.close()
        if self.local:
            # Milvus Lite keeps its in-process server (and the file lock) until the process
            # exits unless released: another process could not open the store meanwhile.
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(self.uri)

    # ---- collections ---------------------------------------------------------------------

    def ensure_collection(self, meta: VectorMeta, dimension: int, fields: Sequence[str] = ("vector",)) -> str:
        """The collection of `meta`'s schema, created on first use; `fields`: its vector fields,
        `vector` (dense, cosine) and / or `sparse` (SPARSE_FLOAT_VECTOR, inner product)."""
        name = collection_name(meta.embedding_schema)
        if self.client.has_collection(name):
            self._check_schema(name, meta.embedding_schema)
            return name
        from pymilvus import DataType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
        index = self.client.prepare_index_params()
        if "vector" in fields:
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dimension)
            index.add_index(field_name="vector", index_type="AUTOINDEX", metric_type="COSINE")
        if SPARSE_FIELD in fields:
            schema.add_field(SPARSE_FIELD, DataType.SPARSE_FLOAT_VECTOR)
            index.add_index(field_name=SPARSE_FIELD, index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        schema.add_field("doc_id", DataType.VARCHAR, max_length=2048)
        schema.add_field("chunk_idx", DataType.INT64)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
        schema.add_field("text_hash", DataType.VARCHAR, max_length=64)
        for field in META_FIELDS:
            schema.add_field(field, DataType.VARCHAR, max_length=512)
        described = " ".join(f"{k}={v}" for k, v in meta.fields().items())
        self.client.create_collection(
            name,
            schema=schema,
            index_params=index,
            description=f"embedserve vectors: {described}",
            properties={SCHEMA_PROPERTY: meta.embedding_schema, "model": meta.model},
        )
        return name

    def schema_of(self, collection: str) -> str:
        info = self.client.describe_collection(collection)
        schema = (info.get("properties") or {}).get(SCHEMA_PROPERTY)
        if not schema:
            found = _SCHEMA_IN_DESCRIPTION.search(info.get("description") or "")
            schema = found.group(1) if found else None
        if not schema:
            raise StoreError(f"collection {collection} records no embedding_schema: not made by embedserve")
        return str(schema)

    def model_of(self, collection: str) -> str:
        """The model name recorded when the collection was made ("unknown" if none)."""
        info = self.client.describe_collection(collection)
        return str((info.get("properties") or {}).get("model", "unknown"))

    def _check_schema(self, collection: str, expected: str) -> None:
        recorded = self.schema_of(collection)
        if recorded != expected:
            raise StoreError(f"collection {collection} records schema {recorded}, expected {expected}")

    def _load(self, collection: str) -> None:
        # A reopened store starts with every collection released; reads need it loaded.
        if collection not in self._loaded:
            self.client.load_collection(collection)
            self._loaded.add(collection)

    def count(self, collection: str) -> int:
        self._load(collection)
        res = self.client.query(collection, filter="", output_fields=["count(*)"])
        return int(res[0]["count(*)"])

    # ---- aliases -----------------------------------------------------------------------------

    def aliases(self) -> dict[str, str]:
        """Role -> collection, for the roles that are set."""
        out = {}
        for alias in self.client.list_aliases().get("aliases", []):
            if alias in ROLES:
                out[alias] = self.client.describe_alias(alias)["collection_name"]
        return out

    def resolve(self, role: str) -> str:
        target = self.aliases().get(role)
        if target is None:
            raise StoreError(f"the store {self.uri} has no '{role}' index; build one with `embedserve index`")
        return target

    def point(self, role: str, collection: str) -> None:
        """Point `role` at `collection`: one alias operation, atomic for readers."""
        if role in self.aliases():
            self.client.alter_alias(collection, role)
        else:
            self.client.create_alias(collection, role)

    def unpoint(self, role: str) -> None:
        if role in self.aliases():
            self.client.drop_alias(role)

    # ---- rows --------------------------------------------------------------------------------

    def stored_chunks(self, collection: str) -> dict[str, StoredChunk]:
        """Every stored row's id -> (text_hash, doc_id, chunk_idx)."""
        self._load(collection)
        it = self.client.query_iterator(
            collection,
            batch_size=_ID_BATCH,
            filter="",
            output_fields=["id", "text_hash", "doc_id", "chunk_idx"],
        )
        out: dict[str, StoredChunk] = {}
        try:
            while batch := it.next():
                for r in batch:
                    out[r["id"]] = StoredChunk(r["text_hash"], r["doc_id"], int(r["chunk_idx"]))
        finally:
            it.close()
        return out

    def upsert(self, collection: str, rows: list[dict[str, Any]]) -> None:
        """Upsert, not insert: a row written twice (a rerun racing a killed run's last batch)
        replaces itself instead of becoming a duplicate."""
        if rows:
            self.client.upsert(collection, rows)

    def delete(self, collection: str, ids: Sequence[str]) -> None:
        for i in range(0, len(ids), _ID_BATCH):
            self.client.delete(collection, ids=list(ids[i : i + _ID_BATCH]))

    def flush(self, collection: str) -> None:
        self.client.flush(collection)

    def rows(
        self, collection: str, filter_expr: str = "", fields: Sequence[str] = ROW_FIELDS
    ) -> list[dict[str, Any]]:
        """Every row matching `filter_expr`: its `fields` (by default all but the vectors)."""
        self._load(collection)
        it = self.client.query_iterator(
            collection, batch_size=_ID_BATCH, filter=filter_expr, output_fields=list(fields)
        )
        out: list[dict[str, Any]] = []
        try:
            while batch := it.next():
                out.extend(dict(r) for r in batch)
        finally:
            it.close()
        return out

    def search(
        self,
        collection: str,
        vectors: np.ndarray,
        k: int,
        filter_expr: str = "",
        with_text: bool = True,
        with_vectors: bool = False,
        field: str = "vector",
    ) -> list[list[Hit]]:
        """Top-k chunks per query vector by cosine similarity, or per sparse query (`field`
        "sparse": `{id: weight}` rows) by inner product (text left empty unless asked)."""
        self._load(collection)
        fields = [
            "doc_id",
            "chunk_idx",
            *(["text"] if with_text else []),
            *(["vector"] if with_vectors else []),
        ]
        try:
            results = self.client.search(
                collection,
                data=[v if isinstance(v, dict) else v.tolist() for v in vectors],
                anns_field=field,
                limit=k,
                filter=filter_expr,
                output_fields=fields,
            )
        except Exception as e:  # a bad --filter expression lands here
            raise StoreError(f"search in {collection} failed: {e}") from None
        return self._hits(results, with_vectors)

    def hybrid_search(
        self, collection: str, dense: np.ndarray, sparse: list[dict[int, float]], k: int, depth: int,
        ranker: Any, filter_expr: str = "",
    ) -> list[list[Hit]]:  # fmt: skip
        """Top-k chunks per query fusing its dense (top `depth` by cosine) and sparse (top
        `depth` by inner product) rankings with `ranker` (index/sparse.py's Fusion)."""
        from pymilvus import AnnSearchRequest

        self._load(collection)
        out = []
        try:
            for d, s in zip(dense, sparse, strict=True):
                requests = [
                    AnnSearchRequest([d.tolist()], "vector", {"metric_type": "COSINE"}, depth, filter_expr),
                    AnnSearchRequest([s], SPARSE_FIELD, {"metric_type": "IP"}, depth, filter_expr),
                ]
                found = self.client.hybrid_search(
                    collection, requests, ranker, limit=k, output_fields=["doc_id", "chunk_idx", "text"]
                )
                out += self._hits(found, False)
        except Exception as e:  # a bad --filter expression lands here
            raise StoreError(f"hybrid search in {collection} failed: {e}") from None
        return out

    @staticmethod
    def _hits(results: Any, with_vectors: bool) -> list[list[Hit]]:
        return [
            [
                Hit(
                    e["doc_id"],
                    int(e["chunk_idx"]),
                    float(h["distance"]),
                    e.get("text", ""),
                    np.asarray(e["vector"], dtype=np.float32) if with_vectors else None,
                )
                for h in hits
                for e in [h["entity"]]
            ]
            for hits in results
        ]
