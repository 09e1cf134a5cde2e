"""`http(s)://HOST:PORT?model=NAME&api_key_env=VAR&...`: any OpenAI-compatible `/v1/embeddings`.

The URL names the server (`/v1` is added), its `/v1`, or the embeddings route itself. Keys
(embedders/spec.py): `model` (default: the only model `/v1/models` lists), `api_key_env` (the
environment variable holding the key; `api_key` works too but is never written to reports),
`tokenizer`, `max_length`, `timeout` (s), `retries` (on 429/503, honouring Retry-After),
`batch_size`, `batch_tokens`. Any other key is sent as an extra JSON field of every request (e.g.
`truncate=end`). OpenAI's API has no prompt field: prompts are prepended to the text. Text +
image inputs go as content items (images as PNG data URIs), the prompt as embedserve's `prompt`
field (the instruction of the chat format).

The one client of the wire format: `Endpoint` (URLs, key, model, extra fields, the request body,
reading a reply: float or base64 vectors and the server's metadata), shared with bench's per-input
async client; `EmbeddingsClient`, the synchronous one (backpressure waited out, a request too
large for the server sent in halves); `HttpSource` (embedders/http_source.py), the VectorSource
on it. index's HttpEmbedder (index/http_embedder.py) is the same client with index's policies.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from embedserve.embedders.base import Item, Parts
from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import Spec
from embedserve.pooling.outputs import Output

_RETRY_STATUS = (429, 503)
_NOT_METADATA = ("data", "object", "usage")


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


def _vector(embedding: Any) -> Any:
    """One reply row: a list of floats, or (encoding_format=base64) little-endian float32 bytes."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return embedding


def api_base(url: str) -> str:
    """Where `/embeddings` and `/models` live, for a URL naming the server (`/v1` added), its `/v1`,
    or its embeddings route (taken as it is)."""
    base = url.split("?", 1)[0].rstrip("/")
    if base.endswith("/embeddings"):
        return base.removesuffix("/embeddings")
    return base if base.endswith("/v1") else base + "/v1"


class Unreachable(SourceError):
    """A request got no answer (refused or reset connection, timeout); `error` says which."""

    def __init__(self, url: str, error: httpx.HTTPError) -> None:
        super().__init__(f"{url}: {type(error).__name__}: {error}")
        self.error = error


class Refused(SourceError):
    """The endpoint answered a status other than 200 (backpressure already waited out)."""

    def __init__(self, url: str, status: int, text: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {text[:300]}")
        self.status = status
        self.text = text


@dataclass(frozen=True)
class Reply:
    """One answered embeddings request."""

    vectors: np.ndarray  # float32 [inputs sent, dim], in input order ([sent, 0] for sparse rows)
    metadata: dict[str, Any]  # every other top-level field (embedserve: model, model_version, ...)
    prompt_tokens: int
    # `embedding_type: sparse` answers: each input's {vocabulary id: weight}, in input order
    sparse: tuple[dict[int, float], ...] | None = None


class Endpoint:
    """An OpenAI-compatible endpoint as a spec names it (or, `at`, as flags name it)."""

    def __init__(self, spec: Spec) -> None:
        key_env = spec.option("api_key_env")
        api_key = spec.option("api_key") or (os.environ.get(key_env) if key_env else None)
        if key_env and not api_key:
            base = api_base(spec.location)
            raise SourceError(f"{base}: environment variable {key_env} (api_key_env) is not set")
        extra = {k: _coerce(v) for k, v in spec.extra.items()}
        timeout = spec.float_option("timeout", 600.0)
        self._address(spec.location, spec.option("model"), api_key, extra, timeout)

    @classmethod
    def at(cls, url: str, *, model: str | None, api_key: str | None, timeout: float) -> Endpoint:
        """The endpoint of index's `--endpoint URL --api-key KEY --model NAME` flags."""
        endpoint = cls.__new__(cls)
        endpoint._address(url, model, api_key, {}, timeout)
        return endpoint

    def _address(
        self, url: str, model: str | None, api_key: str | None, extra: dict[str, Any], timeout: float
    ) -> None:
        self.base = api_base(url)
        self.url = self.base + "/embeddings"
        self.models_url = self.base + "/models"
        self.model = model
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra = extra
        self.timeout = timeout

    def only_model(self, listing: Any) -> str:
        """The model a `/models` listing names, when it names exactly one."""
        data = listing.get("data", []) if isinstance(listing, dict) else []
        names = [str(m.get("id")) for m in data if isinstance(m, dict)]
        if len(names) != 1:
            raise SourceError(f"{self.base}: pass ?model=NAME; the server lists {names or 'no models'}")
        return names[0]

    def body(
        self, model: str | None, payload: list[Any], prompt: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """A request: `model` (None: the server's), the spec's extra fields, `prompt` (content items:
        embedserve's instruction field) and `fields` (encoding_format, embedserve's priority, truncate,
        dimensions, prompt_name), each left out when None."""
        given = {"model": model, "prompt": prompt or None, **fields}
        body = {"encoding_format": "float", **self.extra, **{k: v for k, v in given.items() if v is not None}}
        body["input"] = payload
        return body

    def vectors(self, reply: Any, sent: int) -> np.ndarray:
        """float32 [sent, dim] in input order, or a SourceError saying what came back instead."""
        try:
            return np.asarray([_vector(r["embedding"]) for r in self._rows(reply, sent)], dtype=np.float32)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SourceError(f"{self.url}: answered without embeddings ({type(e).__name__}: {e})") from None

    def sparse(self, reply: Any, sent: int) -> tuple[dict[int, float], ...]:
        """An `embedding_type: sparse` answer's rows ({"indices", "values"} items) in input order."""
        try:
            items = [r["embedding"] for r in self._rows(reply, sent)]
            return tuple(
                dict(zip(map(int, e["indices"]), map(float, e["values"]), strict=True)) for e in items
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SourceError(
                f"{self.url}: answered without sparse vectors ({type(e).__name__}: {e})"
            ) from None

    def _rows(self, reply: Any, sent: int) -> list[Any]:
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list) or len(data) != sent:
            got = len(data) if isinstance(data, list) else "no"
            raise SourceError(f"{self.url}: sent {sent} inputs, got {got} embeddings")
        try:
            return sorted(data, key=lambda d: int(d.get("index", 0)))
        except (TypeError, ValueError, AttributeError) as e:
            raise SourceError(f"{self.url}: answered without embeddings ({type(e).__name__}: {e})") from None

    def reply(self, reply: Any, sent: int, sparse: bool = False) -> Reply:
        """A reply's vectors (as `vectors`; `sparse`: its sparse rows instead), the rest of it, and
        its prompt-token count."""
        rows = self.sparse(reply, sent) if sparse else None
        vectors = np.zeros((sent, 0), np.float32) if sparse else self.vectors(reply, sent)
        usage = reply.get("usage") or {}
        metadata = {k: v for k, v in reply.items() if k not in _NOT_METADATA}
        return Reply(vectors, metadata, int(usage.get("prompt_tokens", 0)), rows)


class EmbeddingsClient:
    """The synchronous client of an endpoint. Backpressure (429 / 503) is the server working as
    designed: it is waited out as Retry-After says (1 s without one), at most `retries` times
    (None: no count) and while `max_wait_s` has not passed since the request began (None: no
    time limit); after that the refusal is the answer."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        retries: int | None = 8,
        max_wait_s: float | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.retries = retries
        self.max_wait_s = max_wait_s
        self.http = httpx.Client(timeout=endpoint.timeout, headers=endpoint.headers, transport=transport)

    def send(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON of a 200 answer; Unreachable, Refused or a SourceError (not JSON) otherwise."""
        deadline = None if self.max_wait_s is None else time.monotonic() + self.max_wait_s
        waits = 0
        while True:
            try:
                resp = self.http.request(method, url, json=body)
            except httpx.HTTPError as e:
                raise Unreachable(url, e) from None
            if resp.status_code in _RETRY_STATUS and self._may_wait(waits, deadline):
                time.sleep(float(resp.headers.get("retry-after", 1)))
                waits += 1
                continue
            if resp.status_code != 200:
                raise Refused(url, resp.status_code, resp.text)
            try:
                return resp.json()
            except ValueError:
                raise SourceError(f"{url}: the response is not JSON: {resp.text[:200]}") from None

    def _may_wait(self, waits: int, deadline: float | None) -> bool:
        return (self.retries is None or waits < self.retries) and (
            deadline is None or time.monotonic() < deadline
        )

    def embed(self, payload: list[Any], model: str | None, prompt: str | None = None, **fields: Any) -> Reply:
        """One request (`Endpoint.body`'s arguments), answered (sparse rows for `embedding_type`
        sparse)."""
        body = self.endpoint.body(model, payload, prompt, **fields)
        sparse = fields.get("embedding_type") == Output.SPARSE.value
        return self.endpoint.reply(self.send("POST", self.endpoint.url, body), len(payload), sparse)

    def replies(self, payload: list[Any], model: str | None, **fields: Any) -> Iterator[Reply]:
        """`embed`, except that a request of several inputs refused as too large (413: more than the
        server ever queues at once) is sent again in halves, recursively: one Reply per answered
        request, in input order, each as it comes (the caller may stop at any)."""
        try:
            reply = self.embed(payload, model, **fields)
        except Refused as e:
            if e.status != 413 or len(payload) < 2:
                raise
            half = len(payload) // 2
            yield from self.replies(payload[:half], model, **fields)
            yield from self.replies(payload[half:], model, **fields)
            return
        yield reply

    def close(self) -> None:
        self.http.close()
