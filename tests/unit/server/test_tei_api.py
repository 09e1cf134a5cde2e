"""Text Embeddings Inference's routes on a real server and through a gateway: the bodies of TEI's
documentation answer in TEI's shapes, vectors equal `/v1/embeddings`, and huggingface_hub's
InferenceClient (TEI's own Python client) works unchanged over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.tiny_rerankers import build_cross_encoder

TEXTS = ["What is Deep Learning?", "Deep Learning is a subset of machine learning.", "tea " * 80]


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    # 1,024 tokens: above the gateway's long pool (512), and over-long inputs stay cheap (the
    # model's own 32,768 made the truncation test embed three 32K-token inputs)
    with server_client(qwen3_dir, engine=EngineOptions(max_model_len=1024)) as c:
        yield c


def _openai_vectors(client: TestClient, texts: list[str], **extra: Any) -> np.ndarray:
    resp = client.post("/v1/embeddings", json={"input": texts, **extra})
    assert resp.status_code == 200, resp.text
    return np.array([d["embedding"] for d in resp.json()["data"]])


@pytest.mark.parametrize(
    "extra",
    [{}, {"normalize": False}, {"prompt_name": "query"}, {"dimensions": 16}],
    ids=["plain", "unnormalized", "prompt", "dimensions"],
)
def test_embed_equals_openai_embeddings(client: TestClient, extra: dict[str, Any]) -> None:
    one = client.post("/embed", json={"inputs": TEXTS[0], **extra})  # TEI's README body
    assert one.status_code == 200, one.text
    batch = client.post("/embed", json={"inputs": TEXTS, **extra})
    want = _openai_vectors(client, TEXTS, **extra)
    # Alike request for request (a batch's rows round as their batch does).
    np.testing.assert_allclose(np.array(one.json()), _openai_vectors(client, TEXTS[:1], **extra), atol=1e-6)
    np.testing.assert_allclose(np.array(batch.json()), want, atol=1e-6)


def test_embed_truncation_follows_teis_flags(client: TestClient) -> None:
    limit = client.get("/info").json()["max_input_length"]
    long = "wing " * (limit + 50)
    refused = client.post("/embed", json={"inputs": long})  # TEI's default: truncate false
    assert refused.status_code == 400 and "exceed" in refused.json()["error"]["message"]
    assert refused.json()["error"]["message"].endswith("pass truncate: true")  # TEI's flag, not ours
    for direction, policy in (("Right", "end"), ("Left", "start")):
        body = {"inputs": long, "truncate": True, "truncation_direction": direction}
        cut = client.post("/embed", json=body)
        assert cut.status_code == 200, cut.text
        # the second request may reuse the first's cached prefix (its rows then take another
        # matmul kernel): the same vector to float32 rounding, not bit for bit (flaked at 1e-6)
        np.testing.assert_allclose(cut.json(), _openai_vectors(client, [long], truncate=policy), atol=1e-5)


def test_info_describes_the_model_and_limits(client: TestClient) -> None:
    info = client.get("/info").json()
    card = client.get("/v1/models").json()["data"][0]
    assert info["model_id"] == card["id"] and info["model_sha"] == card["model_version"]
    assert info["model_type"] == {"embedding": {"pooling": "last_token"}}
    assert info["max_input_length"] == card["max_model_len"] and info["max_client_batch_size"] >= 1


def test_rerank_answers_teis_shape_for_teis_body(tmp_path: Path) -> None:
    ce = build_cross_encoder(tmp_path / "ce", "bert")
    with server_client(ce) as c:
        tei = c.post("/rerank", json={"query": "What is Deep Learning?", "texts": TEXTS, "return_text": True})
        assert tei.status_code == 200, tei.text
        cohere = c.post("/rerank", json={"query": "What is Deep Learning?", "documents": TEXTS}).json()
        assert [(r["index"], r["score"]) for r in tei.json()] == [
            (r["index"], r["relevance_score"]) for r in cohere["results"]
        ]
        assert [r["text"] for r in tei.json()] == [TEXTS[r["index"]] for r in tei.json()]
        assert c.get("/info").json()["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}}}
        long = {"query": "q", "texts": ["word " * 5000]}  # TEI's default: truncate false
        refused = [
            c.post("/rerank", json=long),
            TestClient(gateway_app(c.app, ce)).post("/rerank", json=long),
        ]
        assert [r.status_code for r in refused] == [400, 400]
        assert all(r.json()["error"]["message"].endswith("pass truncate: true") for r in refused), refused[
            1
        ].text
        both = c.post("/rerank", json={"query": "q", "texts": ["a"], "documents": ["a"]})
        assert both.status_code == 422  # neither shape: Cohere's has no `texts`
        gateway = TestClient(gateway_app(c.app, ce))
        via = gateway.post("/rerank", json={"query": "What is Deep Learning?", "texts": TEXTS})
        assert via.status_code == 200, via.text
        assert [r["index"] for r in via.json()] == [r["index"] for r in tei.json()]


def test_embed_and_info_through_the_gateway(client: TestClient, qwen3_dir: Path) -> None:
    gateway = TestClient(gateway_app(client.app, qwen3_dir))
    resp = gateway.post("/embed", json={"inputs": TEXTS})  # the long text goes to the long pool
    assert resp.status_code == 200 and resp.headers["x-embedserve-pools"] == "short,long", resp.text
    np.testing.assert_allclose(np.array(resp.json()), _openai_vectors(client, TEXTS), atol=1e-5)
    assert gateway.get("/info").json()["model_type"] == {"embedding": {"pooling": "last_token"}}


def test_huggingface_hubs_inference_client_works_unchanged(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient, constants

    # The tests run with HF_HUB_OFFLINE=1, which blocks every request of the client, loopback
    # included; the only address it is given here is the server on 127.0.0.1.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    with threaded_server(client.app) as url:
        tei = InferenceClient(model=f"{url}/embed")
        got = tei.feature_extraction(TEXTS[0], normalize=True, truncate=True)
    np.testing.assert_allclose(np.asarray(got).reshape(1, -1), _openai_vectors(client, TEXTS[:1]), atol=1e-6)
