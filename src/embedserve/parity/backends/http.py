"""`http://HOST:PORT?model=NAME&api_key_env=VAR&...`: any OpenAI-compatible `/v1/embeddings`.

Options: `model` (default: the only model `/v1/models` lists), `api_key_env` (name of the
environment variable holding the key; `api_key` works too but is never written to reports),
`tokenizer` (a local model directory, to measure token lengths when the other side has none),
`max_length`, `timeout` (s), `retries` (on 429/503, honouring Retry-After), `batch_size`,
`batch_tokens`. Any other option is sent as an extra JSON field of every request (e.g.
`truncate=end`). OpenAI's API has no prompt field: prompts are prepended to the text. Text +
image inputs go as content items (images as PNG data URIs), the prompt as embedserve's
`prompt` field (the instruction of the chat format).
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

from embedserve.parity.backends.base import Backend, split_items
from embedserve.parity.datasets import Item, Parts
from embedserve.parity.options import Options, ParityError

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


class HttpBackend(Backend):
    kind = "http"

    def __init__(self, spec: str, url: str, opts: Options) -> None:
        self.spec = spec
        base = url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.model_name = opts.text("model")
        key_env = opts.text("api_key_env")
        api_key = opts.text("api_key") or (os.environ.get(key_env) if key_env else None)
        if key_env and not api_key:
            raise ParityError(f"{url}: environment variable {key_env} (api_key_env) is not set")
        tokenizer = opts.text("tokenizer")
        self.model_dir = Path(tokenizer) if tokenizer else None
        self.max_length = opts.integer("max_length")
        self.retries = opts.integer("retries", 8) or 0
        timeout = float(opts.text("timeout", "600") or 600)
        self.take_batching(opts, 32, 16384)
        self.extra = {k: _coerce(v) for k, v in opts.rest().items()}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers)
        self.server_metadata: dict[str, Any] = {}
        self.usage_tokens = 0
        if self.model_name is None:
            self.model_name = self._only_model()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.base + path
        for attempt in range(self.retries + 1):
            try:
                resp = self.client.request(method, url, json=body)
            except httpx.HTTPError as e:
                raise ParityError(f"{url}: {type(e).__name__}: {e}") from None
            if resp.status_code in _RETRY_STATUS and attempt < self.retries:
                time.sleep(float(resp.headers.get("retry-after", 1)))
                continue
            if resp.status_code != 200:
                raise ParityError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")
            try:
                return resp.json()
            except ValueError:
                raise ParityError(f"{url}: the response is not JSON: {resp.text[:200]}") from None
        raise ParityError(f"{url}: still refused after {self.retries} retries")

    def _only_model(self) -> str:
        listing = self._request("GET", "/models")
        names = [str(m.get("id")) for m in listing.get("data", []) if isinstance(m, dict)]
        if len(names) != 1:
            raise ParityError(f"{self.base}: pass ?model=NAME; the server lists {names or 'no models'}")
        return names[0]

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        body: dict[str, Any] = {"model": self.model_name, "encoding_format": "float", **self.extra}
        if any(isinstance(i, Parts) for i in items):  # content items; the prompt is the instruction
            payload: list[Any] = [content_item(i) for i in items]
            if prompt:
                body["prompt"] = prompt
        else:
            texts, ids = split_items(items)
            payload = [prompt + t for t in texts] if texts else ids
        body["input"] = payload
        reply = self._request("POST", "/embeddings", body)
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list) or len(data) != len(payload):
            got = len(data) if isinstance(data, list) else "no"
            raise ParityError(f"{self.base}/embeddings: sent {len(payload)} inputs, got {got} embeddings")
        if not self.server_metadata:
            self.server_metadata = {k: v for k, v in reply.items() if k not in ("data", "object", "usage")}
        self.usage_tokens += int((reply.get("usage") or {}).get("prompt_tokens", 0))
        rows = sorted(data, key=lambda d: int(d.get("index", 0)))
        return np.asarray([r["embedding"] for r in rows], dtype=np.float32)

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
                "endpoint": self.base + "/embeddings",
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
