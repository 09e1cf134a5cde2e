"""Errors of the indexing tools; the CLI prints them and exits 2."""

from __future__ import annotations

from embedserve.errors import EmbedServeError


class DocumentError(EmbedServeError):
    """An input file cannot be read as documents (names the file and line)."""


class StoreError(EmbedServeError):
    """The vector store is missing something or holds something unexpected."""


class SchemaMismatchError(StoreError):
    """Vectors of one embedding schema were about to meet vectors of another."""

    def __init__(self, what: str, store_schema: str, embedder_schema: str, hint: str = "") -> None:
        message = (
            f"{what}: the store's vectors have embedding_schema {store_schema} but the embedder "
            f"produces {embedder_schema}; vectors of different schemas are not comparable"
        )
        super().__init__(f"{message}. {hint}" if hint else message)
        self.store_schema = store_schema
        self.embedder_schema = embedder_schema


class EndpointError(EmbedServeError):
    """An embeddings endpoint refused a request or answered something unusable."""
