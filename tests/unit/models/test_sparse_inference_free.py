"""Inference-free SPLADE (a sentence-transformers Router: static query weights, a SPLADE model
for documents): queries equal SparseEncoder.encode_query and run no engine step; documents
equal encode_document; the same through /v1/embeddings, /v2/embed and TEI's /embed_sparse."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from tests.helpers.inprocess import server_client
from tests.helpers.tiny_sparse import build_inference_free, build_splade

QUERIES = ["what is the capital of France", "python list comprehension", "Zürich weather"]
DOCS = ["Paris is the capital and largest city of France.", "A list comprehension builds a list."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inference-free")
    return build_inference_free(root / "ifs", build_splade(root / "splade"))


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    from sentence_transformers import SparseEncoder

    enc = SparseEncoder(str(model_dir), device="cpu")
    queries = enc.encode_query(QUERIES, convert_to_tensor=True).to_dense().numpy()
    docs = enc.encode_document(DOCS, convert_to_tensor=True).to_dense().numpy()
    return queries, docs


def test_queries_run_no_step_and_documents_the_model(
    model_dir: Path, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    want_q, want_d = reference
    with Engine.from_pretrained(model_dir) as engine:
        docs = engine.embed(DOCS)
        before = engine.stats()
        queries = engine.embed(QUERIES, prompt_name="query")
        after = engine.stats()
    assert after["steps"] == before["steps"] and after["tokens_computed"] == before["tokens_computed"]
    np.testing.assert_allclose(queries, want_q, atol=1e-6)
    assert all(
        np.array_equal(np.flatnonzero(q), np.flatnonzero(w)) for q, w in zip(queries, want_q, strict=True)
    )
    np.testing.assert_allclose(docs, want_d, atol=1e-5)
    assert all(
        np.array_equal(np.flatnonzero(d), np.flatnonzero(w)) for d, w in zip(docs, want_d, strict=True)
    )


def test_the_routes_answer_queries_and_documents(
    model_dir: Path, reference: tuple[np.ndarray, np.ndarray]
) -> None:
    want_q, want_d = reference
    with server_client(model_dir) as c:
        body = {"input": QUERIES, "embedding_type": "sparse", "prompt_name": "query"}
        got = c.post("/v1/embeddings", json=body).json()
        for item, w in zip(got["data"], want_q, strict=True):
            idx, vals = item["embedding"]["indices"], item["embedding"]["values"]
            assert idx == np.flatnonzero(w).tolist() and np.allclose(vals, w[idx], atol=1e-6)
        cohere = {"texts": QUERIES, "input_type": "search_query", "embedding_types": ["sparse"]}
        v2 = c.post("/v2/embed", json=cohere).json()["embeddings"]["sparse"]
        assert [e["indices"] for e in v2] == [d["embedding"]["indices"] for d in got["data"]]
        tei = c.post("/embed_sparse", json={"inputs": DOCS}).json()
        for doc, w in zip(tei, want_d, strict=True):
            assert [e["index"] for e in doc] == np.flatnonzero(w).tolist()
            assert np.allclose([e["value"] for e in doc], w[np.flatnonzero(w)], atol=1e-5)
        for bad, words in (
            ({**body, "input": ""}, "non-empty string"),
            ({**body, "input": [[1, 2]]}, "string"),
        ):
            r = c.post("/v1/embeddings", json=bad)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert c.post("/v1/embeddings", json={**body, "input": "still fine"}).status_code == 200
        long = {**body, "input": "word " * 600}
        r = c.post("/v1/embeddings", json=long)
        assert r.status_code == 400 and "600 tokens" in r.json()["error"]["message"]
        cut = c.post("/v1/embeddings", json={**long, "truncate": "end"}).json()["data"][0]
        assert cut["truncated"] is True and cut["num_tokens"] == 512
        unit = c.post("/v1/embeddings", json={**body, "normalize": True, "encoding_format": "float"}).json()
        values = unit["data"][0]["embedding"]["values"]
        assert abs(sum(v * v for v in values) - 1.0) < 1e-5


def test_the_gateway_counts_queries_as_the_pools_do(model_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from tests.helpers.inprocess import gateway_app

    body = {"input": QUERIES, "embedding_type": "sparse", "prompt_name": "query"}
    with server_client(model_dir) as c:
        direct = c.post("/v1/embeddings", json=body).json()
        with TestClient(gateway_app(c.app, model_dir)) as g:
            through = g.post("/v1/embeddings", json=body).json()
            metrics = g.get("/metrics").text
    assert [d["embedding"] for d in through["data"]] == [d["embedding"] for d in direct["data"]]
    mismatches = [
        line for line in metrics.splitlines() if line.startswith("embedserve_gateway_count_mismatches")
    ]
    assert all(line.endswith(" 0.0") for line in mismatches), mismatches
