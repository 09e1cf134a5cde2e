"""`--result-cache-entries`: repeated inputs answered from memory on a real server (tiny Qwen3).
Under --deterministic a hit is byte-identical to a recompute; options that change the vector
(dimensions, normalize, prompt, compressed type) never collide; the engine is not touched on a
hit; the LRU holds at most N entries; images are not cached."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from embedserve.server.result_cache import ResultCache
from embedserve.server.runtime import ServerSettings
from embedserve.tokenizer import Tokenized
from tests.helpers.inprocess import runtime_of, server_client


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, engine=EngineOptions(deterministic=True), result_cache_entries=8) as c:
        yield c


def _metric(client: TestClient, name: str) -> float:
    registry = runtime_of(client).metrics.registry
    return registry.get_sample_value(f"embedserve_result_cache_{name}") or 0.0


def _engine_tokens(client: TestClient) -> int:
    engine = runtime_of(client).engine
    assert engine is not None
    return engine.stats()["tokens_computed"]


def _post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_a_hit_is_byte_identical_to_the_recompute(client: TestClient, qwen3_dir: Path) -> None:
    body = {"input": ["the wing stalls at high angles", "a shock wave forms"], "encoding_format": "base64"}
    first = _post(client, body)
    hits, computed = _metric(client, "hits_total"), _engine_tokens(client)
    again = _post(client, body)  # both inputs from the cache: no engine work
    assert _metric(client, "hits_total") == hits + 2 and _engine_tokens(client) == computed
    assert [d["embedding"] for d in again["data"]] == [d["embedding"] for d in first["data"]]
    assert again["usage"] == first["usage"] and again["embedding_schema"] == first["embedding_schema"]
    # The same inputs recomputed by a server without a cache (deterministic): the same bytes.
    with server_client(qwen3_dir, engine=EngineOptions(deterministic=True)) as fresh:
        recomputed = fresh.post("/v1/embeddings", json=body).json()
    assert [d["embedding"] for d in recomputed["data"]] == [d["embedding"] for d in first["data"]]


@pytest.mark.parametrize(
    "options",
    [{"dimensions": 16}, {"normalize": False}, {"prompt_name": "query"}, {"prompt": "Represent: "}],
    ids=["dimensions", "normalize", "prompt_name", "prompt"],
)
def test_options_that_change_the_vector_never_collide(client: TestClient, options: dict[str, Any]) -> None:
    text = "boundary layer separation"
    plain = np.array(_post(client, {"input": text})["data"][0]["embedding"])
    _post(client, {"input": text})  # cached now
    misses = _metric(client, "misses_total")
    other = np.array(_post(client, {"input": text, **options})["data"][0]["embedding"])
    assert _metric(client, "misses_total") == misses + 1  # computed, not served from the cache
    assert other.shape != plain.shape or np.abs(other - plain).max() > 1e-4


def test_compressed_types_come_from_the_cached_float_vector(client: TestClient) -> None:
    text = "lift and drag"
    fresh = _post(client, {"input": [text, "never seen before: binary"], "embedding_type": "binary"})
    cached = _post(client, {"input": [text, "never seen before: binary"], "embedding_type": "binary"})
    assert cached["data"] == fresh["data"] and cached["embedding_schema"] == fresh["embedding_schema"]
    floats = _post(client, {"input": text})
    assert floats["embedding_schema"] != cached["embedding_schema"]


def test_the_lru_holds_at_most_n_entries(client: TestClient) -> None:
    for i in range(20):
        _post(client, {"input": f"text number {i}"})
    cache = runtime_of(client).result_cache
    assert cache is not None and len(cache) == 8 and _metric(client, "entries") == 8
    assert _metric(client, "evictions_total") >= 12
    assert 0 < _metric(client, "bytes") <= 8 * (64 * 4 + 200)
    misses = _metric(client, "misses_total")
    _post(client, {"input": "text number 0"})  # evicted long ago: computed again
    assert _metric(client, "misses_total") == misses + 1


def test_cohere_and_tei_routes_share_the_cache(client: TestClient) -> None:
    text = "the cache is shared by the embedding routes"
    openai = _post(client, {"input": text})["data"][0]["embedding"]
    hits = _metric(client, "hits_total")
    tei = client.post("/embed", json={"inputs": text}).json()[0]
    cohere = client.post("/v2/embed", json={"texts": [text], "embedding_types": ["float"]}).json()
    assert _metric(client, "hits_total") == hits + 2
    assert tei == openai == cohere["embeddings"]["float"][0]


def test_unit_keys_skip_images_and_hold_prompt_positions() -> None:
    from prometheus_client import CollectorRegistry

    from embedserve.vision.state import MultimodalState

    cache = ResultCache(2, CollectorRegistry())
    plain = Tokenized([1, 2, 3], False)
    prompted = Tokenized([1, 2, 3], False, prompt_tokens=1)
    assert cache.key("s", plain) != cache.key("s", prompted) != cache.key("t", prompted)
    image = Tokenized([1, 2, 3], False, multimodal=MultimodalState.__new__(MultimodalState))
    assert cache.key("s", image) is None
    vector = np.ones(4, dtype=np.float32)
    key = cache.key("s", plain)
    assert key is not None
    cache.put(key, vector, 3)
    vector[0] = 5.0  # the caller's array changing later does not change the entry
    hit = cache.get(key)
    assert hit is not None and hit.vector[0] == 1.0 and not hit.vector.flags.writeable
    with pytest.raises(ValueError, match="entries must be >= 1"):
        ResultCache(0, CollectorRegistry())
    with pytest.raises(ValueError, match="result_cache_entries"):
        ServerSettings(model="m", result_cache_entries=-1)
