"""An OpenAI-compatible `/v1/embeddings` endpoint of `embedserve serve` or the gateway, on the
shared client (embedders/http.py: base64 vectors, Retry-After waits, a request too large for the
server sent in halves) with index's policies on top: documents as batch-class traffic, and only
vectors that carry their metadata.

The endpoint's vector metadata comes back with every response; the schema of the first one is
the embedder's, and a later response with another schema (a gateway that switched pools, a
server restarted on other weights) stops the run instead of mixing vector spaces.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np

from embedserve.embedders.errors import SourceError
from embedserve.embedders.http import EmbeddingsClient, Endpoint, Refused, Reply, Unreachable
from embedserve.index.embedder import DOCUMENT_PROMPT, QUERY_PROMPT, Traffic, VectorMeta, pick_prompt
from embedserve.index.errors import EndpointError
from embedserve.pooling.outputs import Output
from embedserve.tokenizer import Tokenizer

_META_FIELDS = tuple(f.name for f in dataclasses.fields(VectorMeta))


class HttpEmbedder:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        model: str | None = None,
        dimensions: int | None = None,
        tokenizer: Tokenizer | None = None,
        query_prompt_name: str | None = None,
        timeout_s: float = 300.0,
        max_wait_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
        late: bool = False,
        sparse: bool = False,
    ) -> None:
        """`sparse`: ask for `embedding_type: sparse` (a SPLADE model's vectors, BGE-M3's lexical
        weights): `embed_sparse` answers, the schema is the sparse one."""
        self.late = late
        self.sparse = sparse
        self.late_prompt_tokens = 0  # the server's document prompt is not known here
        self._endpoint = Endpoint.at(url, model=model, api_key=api_key, timeout=timeout_s)
        # Backpressure is the server working as designed: wait as told, for up to max_wait_s.
        self._client = EmbeddingsClient(
            self._endpoint, retries=None, max_wait_s=max_wait_s, transport=transport
        )
        self._where = self._endpoint.base + "/"  # how index's messages have always named it
        self.dimensions = dimensions
        self.tokenizer = tokenizer
        try:
            card = self._card()
            prompts = card.get("prompt_names", [])
            self.max_tokens: int | None = card.get("max_model_len")
            self._docs = Traffic.documents(pick_prompt(prompts, DOCUMENT_PROMPT, None))
            self._queries = Traffic.queries(pick_prompt(prompts, QUERY_PROMPT, query_prompt_name))
            # One tiny request tells the schema of vectors embedded with exactly these options.
            with self._errors():
                plain = next(self._replies(["metadata probe"], self._queries))
                probe = self._late("metadata probe", [(0, 8)], self._queries) if late else plain
            # queries are plain requests even for a late-chunked index: their own schema
            self._query_schema = self._meta(plain).embedding_schema
            self.meta = self._meta(probe)
        except BaseException:
            self._client.close()
            raise
        self.dimension = probe.vectors.shape[1]  # 0 for sparse rows (a sparse field has none)

    def _card(self) -> dict[str, Any]:
        """The served model's card from /v1/models ({} when the endpoint has none)."""
        try:
            listing = self._client.send("GET", self._endpoint.models_url)
        except Unreachable as e:
            raise EndpointError(f"cannot reach {self._where}: {e.error}") from None
        except Refused:
            return {}
        except SourceError as e:
            raise EndpointError(str(e)) from None
        data = listing.get("data", []) if isinstance(listing, dict) else []
        cards = [c for c in data if isinstance(c, dict)]
        if self._endpoint.model is not None:
            cards = [c for c in cards if c.get("id") == self._endpoint.model]
        return cards[0] if cards else {}

    def _replies(self, texts: list[str], traffic: Traffic) -> Iterator[Reply]:
        return self._client.replies(
            texts,
            self._endpoint.model,
            encoding_format="base64",
            priority=traffic.priority,
            truncate=traffic.truncate,
            dimensions=self.dimensions,
            prompt_name=traffic.prompt_name,
            embedding_type=Output.SPARSE.value if self.sparse else None,
        )

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """The shared client's errors as index's (EndpointError: the CLI prints it and exits 2)."""
        try:
            yield
        except Unreachable as e:
            raise EndpointError(f"embeddings request to {self._where} failed: {e.error}") from None
        except Refused as e:
            raise EndpointError(f"{self._endpoint.url} answered {e.status}: {e.text[:500]}") from None
        except SourceError as e:
            raise EndpointError(str(e)) from None

    def _meta(self, reply: Reply) -> VectorMeta:
        missing = [k for k in _META_FIELDS if k not in reply.metadata]
        if missing:
            raise EndpointError(
                f"{self._where} returned no {', '.join(missing)}: it is not an embedserve "
                "endpoint, and vectors without a schema cannot be stored safely"
            )
        return VectorMeta(**{k: str(reply.metadata[k]) for k in _META_FIELDS})

    def _late(self, text: str, spans: list[tuple[int, int]], traffic: Traffic) -> Reply:
        """One late-chunked request: `text` with its chunks' character spans."""
        body = self._endpoint.body(
            self._endpoint.model, [], encoding_format="base64", priority=traffic.priority,
            truncate=traffic.truncate, dimensions=self.dimensions, prompt_name=traffic.prompt_name,
            late_chunking=True, chunk_spans=[list(s) for s in spans],
        )  # fmt: skip
        body["input"] = text
        return self._endpoint.reply(self._client.send("POST", self._endpoint.url, body), len(spans))

    def _checked(self, reply: Reply, expected: str | None = None) -> np.ndarray:
        schema, want = self._meta(reply).embedding_schema, expected or self.meta.embedding_schema
        if schema != want:
            raise EndpointError(
                f"{self._where} switched embedding_schema from {want} to {schema} "
                "mid-run; stopping rather than mixing vector spaces"
            )
        return reply.vectors

    def _embed(self, texts: list[str], traffic: Traffic) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._errors():
            want = self._query_schema if traffic is self._queries else None
            return np.concatenate([self._checked(r, want) for r in self._replies(texts, traffic)])

    def embed_late_documents(self, windows: list[tuple[str, list[tuple[int, int]]]]) -> list[np.ndarray]:
        with self._errors():
            return [self._checked(self._late(text, spans, self._docs)) for text, spans in windows]

    def embed_sparse(self, texts: list[str], queries: bool) -> list[dict[int, float]]:
        """Each text's {vocabulary id: weight} (`sparse` endpoints), schema-checked as vectors are."""
        traffic = self._queries if queries else self._docs
        rows: list[dict[int, float]] = []
        with self._errors():
            for reply in self._replies(texts, traffic) if texts else ():
                self._checked(reply, self._query_schema if queries else None)
                rows += reply.sparse or ()
        return rows

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._docs)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._queries)

    def close(self) -> None:
        self._client.close()
