"""Any OpenAI-compatible embeddings endpoint as a benchmark target (a served peer or ours).

The endpoint is the shared one (embedders/http.py: URL, `model=`, `api_key_env=` / `api_key=`,
`timeout=`, other keys sent as JSON fields); bench adds `pid=` (server process whose RSS,
children included, is sampled for peak memory), `priority=1` (send embedserve's `priority`
extension; off by default because other servers reject unknown values) and `queue_header=`
(response header carrying queue time in ms, default x-queue-time), and sends one input per
request. Image-mix inputs go as content items (images as PNG data URIs).
"""

from __future__ import annotations

import math

import httpx

from embedserve.bench.images import http_item
from embedserve.bench.target import BenchInput, Reply, TargetSpec
from embedserve.embedders.errors import SourceError
from embedserve.embedders.http import Endpoint


class TargetError(RuntimeError):
    """The target answered, but not with a vector."""


class HttpSession:
    device = "remote"

    def __init__(self, spec: TargetSpec) -> None:
        self.endpoint = Endpoint(spec)
        self.url = self.endpoint.url
        self._model = self.endpoint.model
        self._priority = spec.option("priority", "0") not in ("0", "", "false")
        self._queue_header = spec.option("queue_header", "x-queue-time") or "x-queue-time"
        self._client = httpx.AsyncClient(timeout=self.endpoint.timeout, headers=self.endpoint.headers)

    async def _model_name(self) -> str:
        if self._model is None:
            try:
                r = await self._client.get(self.endpoint.models_url)
                r.raise_for_status()
                self._model = self.endpoint.only_model(r.json())
            except (httpx.HTTPError, ValueError, SourceError) as e:
                raise TargetError(
                    f"cannot read the model name from {self.endpoint.models_url} ({e}); pass ?model="
                ) from e
        return self._model

    async def embed(self, text: BenchInput, priority: str) -> Reply:
        body = self.endpoint.body(await self._model_name(), [http_item(text)])
        if self._priority:
            body["priority"] = priority
        r = await self._client.post(self.url, json=body)
        if r.status_code != 200:
            raise TargetError(f"HTTP {r.status_code} from {self.url}: {r.text[:300]}")
        try:
            vector = self.endpoint.vectors(r.json(), 1)[0]
        except (ValueError, SourceError) as e:
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
