"""`http(s)://HOST:PORT?model=NAME&api_key_env=VAR&...`: any OpenAI-compatible `/v1/embeddings`.

The URL names the server (`/v1` is added), its `/v1`, or the embeddings route itself. Keys
(embedders/spec.py): `model` (default: the only model `/v1/models` lists), `api_key_env` (the
environment variable holding the key; `api_key` works too but is never written to reports),
`tokenizer`, `max_length`, `timeout` (s), `retries` (on 429/503, honouring Retry-After),
`batch_size`, `batch_tokens`. Any other key is sent as an extra JSON field of every request (e.g.
`truncate=end`). OpenAI's API has no prompt field: prompts are prepended to the text. Text +
image inputs go as content items (images as PNG data URIs), the prompt as embedserve's `prompt`
field (the instruction of the chat format).

`Endpoint` is what every client of the grammar shares (URLs, key, model, extra fields, reading a
reply); `HttpSource` is the synchronous VectorSource on it; bench sends single inputs on it.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from embedserve.embedders.base import Item, Parts, VectorSource, split_items
from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import Spec

_RETRY_STATUS = (429, 503)


def _coerce(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        return value


def content_item(item: Item) -> Any:
    """A multimodal input as `/v1/embeddings` takes it: text parts and images as PNG data URIs."""
    if not isinstance(item, Parts):
        return item if isinstance(item, str) else list(item)
    return {"content": [_part(p) for p in item.parts]}


def _part(p: str | bytes) -> dict[str, Any]:
    if isinstance(p, str):
        return {"type": "text", "text": p}
    url = "data:image/png;base64," + base64.b64encode(p).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


def api_base(url: str) -> str:
    """Where `/embeddings` and `/models` live, for a URL naming the server (`/v1` added), its `/v1`,
    or its embeddings route (taken as it is)."""
    base = url.split("?", 1)[0].rstrip("/")
    if base.endswith("/embeddings"):
        return base.removesuffix("/embeddings")
    return base if base.endswith("/v1") else base + "/v1"


class Endpoint:
    """An OpenAI-compatible endpoint as a spec names it."""

    def __init__(self, spec: Spec) -> None:
        self.base = api_base(spec.location)
        self.url = self.base + "/embeddings"
        self.models_url = self.base + "/models"
        self.model = spec.option("model")
        key_env = spec.option("api_key_env")
        api_key = spec.option("api_key") or (os.environ.get(key_env) if key_env else None)
        if key_env and not api_key:
            raise SourceError(f"{self.base}: environment variable {key_env} (api_key_env) is not set")
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra = {k: _coerce(v) for k, v in spec.extra.items()}
        self.timeout = spec.float_option("timeout", 600.0)

    def only_model(self, listing: Any) -> str:
        """The model a `/models` listing names, when it names exactly one."""
        data = listing.get("data", []) if isinstance(listing, dict) else []
        names = [str(m.get("id")) for m in data if isinstance(m, dict)]
        if len(names) != 1:
            raise SourceError(f"{self.base}: pass ?model=NAME; the server lists {names or 'no models'}")
        return names[0]

    def body(self, model: str, payload: list[Any], prompt: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "encoding_format": "float", **self.extra}
        if prompt:  # content items: the prompt is the instruction (embedserve's extension)
            body["prompt"] = prompt
        body["input"] = payload
        return body

    def vectors(self, reply: Any, sent: int) -> np.ndarray:
        """float32 [sent, dim] in input order, or a SourceError saying what came back instead."""
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list) or len(data) != sent:
            got = len(data) if isinstance(data, list) else "no"
            raise SourceError(f"{self.url}: sent {sent} inputs, got {got} embeddings")
        try:
            rows = sorted(data, key=lambda d: int(d.get("index", 0)))
            return np.asarray([r["embedding"] for r in rows], dtype=np.float32)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SourceError(f"{self.url}: answered without embeddings ({type(e).__name__}: {e})") from None


class HttpSource(VectorSource):
    kind = "http"

    def __init__(self, spec: Spec) -> None:
        self.spec = spec.shown
        self.endpoint = Endpoint(spec)
        self.base = self.endpoint.base
        tokenizer = spec.option("tokenizer")
        self.model_dir = Path(tokenizer) if tokenizer else None
        self.max_length = spec.int_option("max_length")
        self.retries = spec.int_option("retries", 8) or 0
        self.take_batching(spec, 32, 16384)
        self.extra = self.endpoint.extra
        self.client = httpx.Client(timeout=self.endpoint.timeout, headers=self.endpoint.headers)
        self.server_metadata: dict[str, Any] = {}
        self.usage_tokens = 0
        listed = self.endpoint.model or self.endpoint.only_model(
            self._request("GET", self.endpoint.models_url)
        )
        self.model_name = listed

    def _request(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        for attempt in range(self.retries + 1):
            try:
                resp = self.client.request(method, url, json=body)
            except httpx.HTTPError as e:
                raise SourceError(f"{url}: {type(e).__name__}: {e}") from None
            if resp.status_code in _RETRY_STATUS and attempt < self.retries:
                time.sleep(float(resp.headers.get("retry-after", 1)))
                continue
            if resp.status_code != 200:
                raise SourceError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")
            try:
                return resp.json()
            except ValueError:
                raise SourceError(f"{url}: the response is not JSON: {resp.text[:200]}") from None
        raise SourceError(f"{url}: still refused after {self.retries} retries")

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        if any(isinstance(i, Parts) for i in items):  # content items; the prompt is the instruction
            body = self.endpoint.body(self.model_name, [content_item(i) for i in items], prompt)
        else:
            texts, ids = split_items(items)
            body = self.endpoint.body(self.model_name, [prompt + t for t in texts] if texts else ids)
        reply = self._request("POST", self.endpoint.url, body)
        vectors = self.endpoint.vectors(reply, len(body["input"]))
        if not self.server_metadata:
            self.server_metadata = {k: v for k, v in reply.items() if k not in ("data", "object", "usage")}
        self.usage_tokens += int((reply.get("usage") or {}).get("prompt_tokens", 0))
        return vectors

    def describe(self) -> dict[str, Any]:
        meta = self.server_metadata
        return {
            "kind": self.kind,
            "spec": self.spec,
            "model": meta.get("model", self.model_name),
            "model_version": meta.get("model_version"),
            "dtype": meta.get("dtype"),
            "backend_profile": meta.get("backend_profile", f"http:{self.base}"),
            "embedding_schema": meta.get("embedding_schema"),
            "config": {
                "endpoint": self.endpoint.url,
                "model_name": self.model_name,
                "extra_fields": self.extra,
                "server_metadata": meta,
                "usage_prompt_tokens": self.usage_tokens,
                "batch_size": self.batch_items,
                "batch_tokens": self.batch_tokens,
            },
        }

    def close(self) -> None:
        self.client.close()
