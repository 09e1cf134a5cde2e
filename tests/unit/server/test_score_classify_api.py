"""`POST /v1/score` and `POST /classify` on real servers over tiny models, and through a gateway:
score is the cosine of the two `/v1/embeddings` vectors for an embedder (with the same prompt
options) and `/v1/rerank`'s score for a cross-encoder; classify equals transformers'
AutoModelForSequenceClassification + softmax / sigmoid; wrong models and bad bodies are 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.tiny_rerankers import build_cross_encoder

QUERIES = ["how do wings make lift?", "what is a shock wave"]
DOCS = ["Lift comes from the pressure difference over the wing.", "Shock waves form at Mach 1.", "bread"]


@pytest.fixture(scope="module")
def embedder(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir) as c:
        yield c


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    ce = build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")
    with server_client(ce) as c:
        yield c


def _vectors(client: TestClient, texts: list[str], **extra: Any) -> np.ndarray:
    resp = client.post("/v1/embeddings", json={"input": texts, **extra})
    assert resp.status_code == 200, resp.text
    return np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float64)


def _scores(client: TestClient, **body: Any) -> list[float]:
    resp = client.post("/v1/score", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data))) and resp.json()["object"] == "list"
    return [d["score"] for d in data]


@pytest.mark.parametrize("extra", [{}, {"prompt_name": "query"}, {"prompt": "Represent: "}])
def test_score_is_the_cosine_of_the_embeddings_vectors(embedder: TestClient, extra: dict[str, Any]) -> None:
    q = _vectors(embedder, QUERIES, **extra)
    d = _vectors(embedder, DOCS, **extra)
    one_to_n = _scores(embedder, text_1=QUERIES[0], text_2=DOCS, **extra)
    np.testing.assert_allclose(one_to_n, d @ q[0], atol=1e-6)
    n_to_n = _scores(embedder, text_1=QUERIES, text_2=DOCS[:2], **extra)
    np.testing.assert_allclose(n_to_n, [q[0] @ d[0], q[1] @ d[1]], atol=1e-6)
    (one,) = _scores(embedder, text_1=QUERIES[1], text_2=DOCS[1], **extra)
    assert abs(one - q[1] @ d[1]) < 1e-6
    if extra:  # the prompt changes the vectors, so it must change the scores
        plain = _scores(embedder, text_1=QUERIES[0], text_2=DOCS)
        assert max(abs(a - b) for a, b in zip(plain, one_to_n, strict=True)) > 1e-4


def test_score_is_reranks_score_for_a_cross_encoder(cross_encoder: TestClient) -> None:
    for raw in (False, True):
        ranked = cross_encoder.post(
            "/v1/rerank", json={"query": QUERIES[0], "documents": DOCS, "raw_scores": raw}
        )
        by_index = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
        scores = _scores(cross_encoder, text_1=QUERIES[0], text_2=DOCS, raw_scores=raw)
        np.testing.assert_allclose(scores, [by_index[i] for i in range(len(DOCS))], atol=1e-6)
    pairs = _scores(cross_encoder, text_1=QUERIES, text_2=DOCS[:2])
    for q, d, s in zip(QUERIES, DOCS, pairs, strict=False):
        alone = cross_encoder.post("/v1/rerank", json={"query": q, "documents": [d]}).json()
        assert abs(alone["results"][0]["relevance_score"] - s) < 1e-6


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 422, "one text_1 (1:N) or as many as text_2"),
        ({"text_1": [], "text_2": ["c"]}, 422, "at least one text"),
        ({"text_1": "a"}, 422, "text_2"),
        ({"text_1": "a", "text_2": "b", "raw_scores": True}, 400, "a reranker's"),
        ({"text_1": "a", "text_2": ""}, 400, "empty"),
        ({"text_1": "a", "text_2": "b", "prompt_name": "nope"}, 400, "unknown prompt name"),
    ],
)
def test_bad_score_bodies_are_clear_4xx(
    embedder: TestClient, body: dict[str, Any], status: int, message: str
) -> None:
    resp = embedder.post("/v1/score", json=body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]


def test_score_and_classify_through_the_gateway(embedder: TestClient, qwen3_dir: Path) -> None:
    gateway = TestClient(gateway_app(embedder.app, qwen3_dir, served_model_name="scorer"))
    direct = _scores(embedder, text_1=QUERIES[0], text_2=DOCS)
    via = gateway.post("/v1/score", json={"text_1": QUERIES[0], "text_2": DOCS})
    assert via.status_code == 200 and via.json()["model"] == "scorer", via.text
    np.testing.assert_allclose([d["score"] for d in via.json()["data"]], direct, atol=1e-6)
    refused = gateway.post("/classify", json={"input": "x"})
    assert refused.status_code == 400 and "POST /v1/embeddings" in refused.json()["error"]["message"]


# ---- classify --------------------------------------------------------------------------------

LABELS = ["negative", "neutral", "positive"]
TEXTS = ["the wing stalled", "a calm flight over the sea with no turbulence at all", "ok", "lift " * 40]


def _reference(model_dir: Path, texts: list[str], multi_label: bool) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        logits = model(**tok(texts, padding=True, return_tensors="pt")).logits
    return (torch.sigmoid(logits) if multi_label else torch.softmax(logits, -1)).numpy()


@pytest.mark.parametrize("problem_type", [None, "multi_label_classification"])
def test_classify_equals_transformers(tmp_path: Path, problem_type: str | None) -> None:
    model = build_cross_encoder(tmp_path / "clf", "bert", seed=4, labels=LABELS, problem_type=problem_type)
    ref = _reference(model, TEXTS, problem_type is not None)
    with server_client(model) as c:
        resp = c.post("/classify", json={"input": TEXTS})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        probs = np.array([d["probs"] for d in body["data"]])
        np.testing.assert_allclose(probs, ref, atol=1e-5)
        assert [d["label"] for d in body["data"]] == [LABELS[i] for i in ref.argmax(1)]
        assert {d["num_classes"] for d in body["data"]} == {3} and body["usage"]["prompt_tokens"] > 0
        # TEI's /predict: the same probabilities, labels best first; one input or a batch.
        one = c.post("/predict", json={"inputs": TEXTS[0]}).json()
        assert [p["label"] for p in one] == [LABELS[i] for i in np.argsort(-ref[0], kind="stable")]
        assert abs(one[0]["score"] - ref[0].max()) < 1e-5
        batch = c.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
        assert [b[0]["label"] for b in batch] == [d["label"] for d in body["data"]]
        info = c.get("/info").json()
        assert info["model_type"] == {"classifier": {"id2label": {str(i): x for i, x in enumerate(LABELS)}}}
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 400
        long = "x " * 5000  # over max_model_len: each body's hint names its own truncation field
        vllm, tei = c.post("/classify", json={"input": long}), c.post("/predict", json={"inputs": long})
        assert vllm.status_code == tei.status_code == 400
        assert vllm.json()["error"]["message"].endswith("pass truncate='end' / 'start'")
        assert tei.json()["error"]["message"].endswith("pass truncate: true")


def test_classify_refusals(embedder: TestClient) -> None:
    resp = embedder.post("/classify", json={"input": ["a"]})
    assert resp.status_code == 400 and "embedding model" in resp.json()["error"]["message"]
    bad = embedder.post("/predict", json={"inputs": ["a", "b", "c"]})
    assert bad.status_code == 422 and "pair" in bad.json()["error"]["message"]
