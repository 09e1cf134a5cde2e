"""An OpenAI-compatible `/v1/embeddings` endpoint of `embedserve serve` or the gateway.

The endpoint's vector metadata comes back with every response; the schema of the first one is
the embedder's, and a later response with another schema (a gateway that switched pools, a
server restarted on other weights) stops the run instead of mixing vector spaces.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import numpy as np

from embedserve.embedders.http import api_base
from embedserve.index.embedder import DOCUMENT_PROMPT, QUERY_PROMPT, Traffic, VectorMeta, pick_prompt
from embedserve.index.errors import EndpointError
from embedserve.tokenizer import Tokenizer

_META_FIELDS = ("model", "model_version", "dtype", "backend_profile", "embedding_schema")
_RETRY_STATUSES = (429, 503)


class _TooLarge(Exception):
    """413 for a request of several inputs: the server can take them in smaller requests."""


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
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=api_base(url), headers=headers, timeout=timeout_s, transport=transport
        )
        self._model = model
        self.dimensions = dimensions
        self.tokenizer = tokenizer
        self._max_wait_s = max_wait_s
        try:
            card = self._card()
            prompts = card.get("prompt_names", [])
            self.max_tokens: int | None = card.get("max_model_len")
            self._docs = Traffic.documents(pick_prompt(prompts, DOCUMENT_PROMPT, None))
            self._queries = Traffic.queries(pick_prompt(prompts, QUERY_PROMPT, query_prompt_name))
            # One tiny request tells the schema of vectors embedded with exactly these options.
            body = self._post(["metadata probe"], self._queries)
        except BaseException:
            self._client.close()
            raise
        self.meta = VectorMeta(**{k: str(body[k]) for k in _META_FIELDS})
        self.dimension = len(self._vectors(body)[0])

    def _card(self) -> dict[str, Any]:
        """The served model's card from /v1/models ({} when the endpoint has none)."""
        try:
            r = self._client.get("/models")
        except httpx.HTTPError as e:
            raise EndpointError(f"cannot reach {self._client.base_url}: {e}") from None
        if r.status_code != 200:
            return {}
        cards = [c for c in r.json().get("data", []) if isinstance(c, dict)]
        if self._model is not None:
            cards = [c for c in cards if c.get("id") == self._model]
        return cards[0] if cards else {}

    def _post(self, texts: list[str], traffic: Traffic) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "input": texts,
            "encoding_format": "base64",
            "priority": traffic.priority,
            "truncate": traffic.truncate,
        }
        for key, value in (
            ("model", self._model),
            ("dimensions", self.dimensions),
            ("prompt_name", traffic.prompt_name),
        ):
            if value is not None:
                payload[key] = value
        deadline = time.monotonic() + self._max_wait_s
        while True:
            try:
                r = self._client.post("/embeddings", json=payload)
            except httpx.HTTPError as e:
                raise EndpointError(f"embeddings request to {self._client.base_url} failed: {e}") from None
            # Backpressure is the server working as designed: wait as told, up to a limit.
            if r.status_code in _RETRY_STATUSES and time.monotonic() < deadline:
                time.sleep(float(r.headers.get("Retry-After", "1")))
                continue
            if r.status_code == 413 and len(texts) > 1:
                raise _TooLarge()
            if r.status_code != 200:
                raise EndpointError(
                    f"{self._client.base_url}/embeddings answered {r.status_code}: {r.text[:500]}"
                )
            body: dict[str, Any] = r.json()
            missing = [k for k in _META_FIELDS if k not in body]
            if missing:
                raise EndpointError(
                    f"{self._client.base_url} returned no {', '.join(missing)}: it is not an embedserve "
                    "endpoint, and vectors without a schema cannot be stored safely"
                )
            return body

    @staticmethod
    def _vectors(body: dict[str, Any]) -> np.ndarray:
        rows = sorted(body["data"], key=lambda d: d["index"])
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in rows])

    def _embed(self, texts: list[str], traffic: Traffic) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        try:
            body = self._post(texts, traffic)
        except _TooLarge:
            # More than the server ever queues at once: send it in halves.
            half = len(texts) // 2
            return np.concatenate(
                [
                    self._embed(texts[:half], traffic),
                    self._embed(texts[half:], traffic),
                ]
            )
        if body["embedding_schema"] != self.meta.embedding_schema:
            raise EndpointError(
                f"{self._client.base_url} switched embedding_schema from {self.meta.embedding_schema} to "
                f"{body['embedding_schema']} mid-run; stopping rather than mixing vector spaces"
            )
        return self._vectors(body).astype(np.float32)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._docs)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, self._queries)

    def close(self) -> None:
        self._client.close()
