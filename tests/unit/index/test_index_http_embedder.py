"""HttpEmbedder against a scripted endpoint: metadata, prompts, backpressure, refusals."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from embedserve.index.errors import EndpointError
from embedserve.index.http_embedder import HttpEmbedder

META = {
    "model": "m",
    "model_version": "v",
    "dtype": "float32",
    "backend_profile": "cpu-fp32",
    "embedding_schema": "es1-aaaa",
}


def _body(n: int, schema: str = "es1-aaaa", dim: int = 4) -> dict[str, object]:
    vec = base64.b64encode(np.arange(dim, dtype="<f4").tobytes()).decode()
    return {"object": "list", "data": [{"index": i, "embedding": vec} for i in range(n)], **META,
            "embedding_schema": schema}  # fmt: skip


def _transport(
    answer: Callable[[dict[str, object], int], httpx.Response], seen: list[dict[str, object]]
) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            card = {"id": "m", "prompt_names": ["document", "query"], "max_model_len": 512}
            return httpx.Response(200, json={"data": [card]})
        payload = json.loads(request.content)
        seen.append(payload)
        return answer(payload, len(seen))

    return httpx.MockTransport(handle)


def test_metadata_prompts_and_priorities() -> None:
    seen: list[dict[str, object]] = []
    t = _transport(lambda p, _: httpx.Response(200, json=_body(len(p["input"]))), seen)  # type: ignore[arg-type]
    e = HttpEmbedder("http://x:1", transport=t, dimensions=4)
    assert e.meta.embedding_schema == "es1-aaaa" and e.dimension == 4 and e.max_tokens == 512
    docs = e.embed_documents(["a", "b"])
    e.embed_queries(["q"])
    assert docs.shape == (2, 4) and docs.dtype == np.float32
    probe, doc, query = seen
    assert doc["prompt_name"] == "document" and doc["priority"] == "batch" and doc["dimensions"] == 4
    assert doc["truncate"] == "error" and query["truncate"] == "end"
    assert query["prompt_name"] == "query" and query["priority"] == "online"
    assert probe["encoding_format"] == "base64"


def test_backpressure_is_waited_out() -> None:
    seen: list[dict[str, object]] = []

    def answer(p: dict[str, object], n: int) -> httpx.Response:
        if n == 2:
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"error": {}})
        return httpx.Response(200, json=_body(len(p["input"])))  # type: ignore[arg-type]

    e = HttpEmbedder("http://x:1/v1", transport=_transport(answer, seen))
    assert e.embed_documents(["a"]).shape == (1, 4) and len(seen) == 3


def test_schema_switch_mid_run_stops() -> None:
    seen: list[dict[str, object]] = []

    def answer(p: dict[str, object], n: int) -> httpx.Response:
        return httpx.Response(200, json=_body(len(p["input"]), "es1-aaaa" if n == 1 else "es1-bbbb"))  # type: ignore[arg-type]

    e = HttpEmbedder("http://x:1", transport=_transport(answer, seen))
    with pytest.raises(EndpointError, match="switched embedding_schema from es1-aaaa to es1-bbbb"):
        e.embed_documents(["a"])


def test_endpoints_without_metadata_or_failing_are_refused() -> None:
    plain = {"data": [{"index": 0, "embedding": []}]}
    t = _transport(lambda p, _: httpx.Response(200, json=plain), [])
    with pytest.raises(EndpointError, match=r"returned no model, model_version.*not an embedserve endpoint"):
        HttpEmbedder("http://x:1", transport=t)
    t = _transport(lambda p, _: httpx.Response(401, json={"error": {"message": "bad key"}}), [])
    with pytest.raises(EndpointError, match=r"answered 401.*bad key"):
        HttpEmbedder("http://x:1", transport=t)


def test_a_batch_too_large_for_the_server_is_split() -> None:
    seen: list[dict[str, object]] = []

    def answer(p: dict[str, object], n: int) -> httpx.Response:
        n_in = len(p["input"])  # type: ignore[arg-type]
        if n_in > 2:
            return httpx.Response(413, json={"error": {"message": "split it"}})
        return httpx.Response(200, json=_body(n_in))

    e = HttpEmbedder("http://x:1", transport=_transport(answer, seen))
    assert e.embed_documents(["a", "b", "c", "d", "e"]).shape == (5, 4)
    assert [len(p["input"]) for p in seen[1:]] == [5, 2, 3, 1, 2]  # type: ignore[arg-type]
