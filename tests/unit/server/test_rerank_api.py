"""`POST /v1/rerank` (and its aliases) in-process: shape, order, limits, task mismatches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from embedserve import Engine
from embedserve.engine.options import EngineOptions
from embedserve.server.app import create_app
from embedserve.server.runtime import ServerSettings
from tests.helpers.tiny_rerankers import build_cross_encoder

QUERY = "how do wings produce lift"
DOCS = ["pressure difference over an airfoil", "boundary layers", "lift", "shock waves in nozzles"]


def _ready(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as c:
        deadline = time.monotonic() + 60
        while c.get("/health/ready").status_code != 200:
            assert time.monotonic() < deadline, c.get("/health/ready").json()
            time.sleep(0.05)
        yield c


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")


@pytest.fixture(scope="module")
def client(ce_dir: Path) -> Iterator[TestClient]:
    settings = ServerSettings(
        model=str(ce_dir),
        engine=EngineOptions(max_model_len=128, max_num_batched_tokens=512),
        warmup_lengths=(16,),
        max_inputs_per_request=8,
    )
    yield from _ready(create_app(settings))


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_shape_and_order(client: TestClient, ce_dir: Path, path: str) -> None:
    docs: list[Any] = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]
    resp = client.post(path, json={"query": QUERY, "documents": docs, "top_n": 3, "return_documents": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    results = body["results"]
    assert len(results) == 3 and body["model"] == "bert-ce" and body["embedding_schema"].startswith("es1-")
    assert body["usage"]["total_tokens"] > 0 and "x-inference-time" in resp.headers
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in results)
    with Engine.from_pretrained(ce_dir, max_model_len=128, max_num_batched_tokens=512) as e:
        ref = e.rerank(QUERY, DOCS, top_n=3)
    assert [r.index for r in ref] == [r["index"] for r in results]
    assert all(abs(a.relevance_score - b) < 1e-6 for a, b in zip(ref, scores, strict=True))


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"query": QUERY, "documents": []}, 422),
        ({"query": "", "documents": DOCS}, 400),
        ({"query": QUERY, "documents": DOCS, "top_n": 0}, 422),
        ({"query": QUERY, "documents": DOCS * 3}, 400),  # 12 > 8 documents
        ({"query": QUERY, "documents": [""]}, 400),
        ({"query": QUERY, "documents": ["word " * 500], "truncate": "error"}, 400),
        ({"query": QUERY, "documents": DOCS, "model": "other"}, 404),
        ({"documents": DOCS}, 422),
    ],
)
def test_bad_rerank_requests(client: TestClient, body: dict[str, Any], status: int) -> None:
    assert client.post("/v1/rerank", json=body).status_code == status


def test_a_reranker_refuses_embeddings(client: TestClient) -> None:
    resp = client.post("/v1/embeddings", json={"input": "hello"})
    assert resp.status_code == 400 and "reranker" in resp.json()["error"]["message"]


def test_an_embedding_model_refuses_rerank(qwen3_dir: Path) -> None:
    settings = ServerSettings(
        model=str(qwen3_dir), engine=EngineOptions(max_model_len=128), warmup_lengths=(16,)
    )
    for c in _ready(create_app(settings)):
        resp = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert resp.status_code == 400 and "embedding model" in resp.json()["error"]["message"]


def test_a_rerank_over_the_queue_bound_is_413(ce_dir: Path) -> None:
    settings = ServerSettings(
        model=str(ce_dir),
        engine=EngineOptions(max_model_len=128, max_num_batched_tokens=512),
        warmup_lengths=(16,),
        max_queued_tokens=40,
    )
    for c in _ready(create_app(settings)):
        assert c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS[:1]}).status_code == 200
        resp = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert resp.status_code == 413 and "split it" in resp.json()["error"]["message"]
