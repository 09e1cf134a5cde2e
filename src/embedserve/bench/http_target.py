"""Any OpenAI-compatible embeddings endpoint as a benchmark target (a served peer or ours).

Options: `model=` (default: the first id under /models), `pid=` (server process whose RSS,
children included, is sampled for peak memory), `priority=1` (send embedserve's `priority`
extension; off by default because other servers reject unknown values), `queue_header=`
(response header carrying queue time in ms, default x-queue-time), `timeout=` seconds.
Image-mix inputs go as content items (images as PNG data URIs).
"""

from __future__ import annotations

import math

import httpx
import numpy as np

from embedserve.bench.images import http_item
from embedserve.bench.target import BenchInput, Reply, TargetSpec


class TargetError(RuntimeError):
    """The target answered, but not with a vector."""


class HttpSession:
    device = "remote"

    def __init__(self, spec: TargetSpec) -> None:
        base = spec.location.split("?", 1)[0].rstrip("/")
        self.url = base if base.endswith("/embeddings") else base + "/embeddings"
        self._models_url = self.url.removesuffix("/embeddings") + "/models"
        self._model = spec.options.get("model")
        self._priority = spec.options.get("priority", "0") not in ("0", "", "false")
        self._queue_header = spec.options.get("queue_header", "x-queue-time")
        self._client = httpx.AsyncClient(timeout=float(spec.options.get("timeout", "600")))

    async def _model_name(self) -> str:
        if self._model is None:
            try:
                r = await self._client.get(self._models_url)
                r.raise_for_status()
                self._model = str(r.json()["data"][0]["id"])
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                raise TargetError(
                    f"cannot read the model name from {self._models_url} ({e}); pass ?model="
                ) from e
        return self._model

    async def embed(self, text: BenchInput, priority: str) -> Reply:
        body: dict[str, object] = {
            "input": [http_item(text)],
            "model": await self._model_name(),
            "encoding_format": "float",
        }
        if self._priority:
            body["priority"] = priority
        r = await self._client.post(self.url, json=body)
        if r.status_code != 200:
            raise TargetError(f"HTTP {r.status_code} from {self.url}: {r.text[:300]}")
        try:
            vector = np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise TargetError(f"{self.url} answered 200 without an embedding: {r.text[:200]}") from e
        return Reply(vector, _seconds(r.headers.get(self._queue_header)))

    def counters(self) -> dict[str, int]:
        return {}

    async def aclose(self) -> None:
        await self._client.aclose()


def _seconds(ms: str | None) -> float | None:
    try:
        value = float(ms) / 1000 if ms is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def open_http(spec: TargetSpec, token_budget: int | None) -> HttpSession:
    return HttpSession(spec)
