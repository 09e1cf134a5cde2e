"""Multi-vectors as users call them: `POST /v1/embeddings` with `embedding_type: multivector`
through the openai client (base64 on the wire) and plain JSON; `/v1/rerank` by MaxSim equal
to MaxSim of the returned vectors; compressed vectors; the refusals, each naming the problem,
with the server still answering."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient

from embedserve.api.quantize import quantize
from embedserve.engine.multivector import maxsim
from tests.helpers.engine_calls import embed_multivector
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import gateway_app, runtime_of, server_client
from tests.helpers.tiny_multivector import build_colbert

DOCS = ["Python is a programming language.", "The Spree flows through Berlin.", "Sorting lists in place."]


@pytest.fixture(scope="module")
def colbert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_colbert(tmp_path_factory.mktemp("colbert-api") / "c")


def test_openai_client_and_json_get_the_engine_vectors(colbert: Path) -> None:
    with server_client(colbert) as c, threaded_server(c.app) as base:
        engine = runtime_of(c).engine
        assert engine is not None
        want = embed_multivector(engine, DOCS)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        resp = client.embeddings.create(model="c", input=DOCS, extra_body={"embedding_type": "multivector"})
        compressed = client.embeddings.create(
            model="c",
            input=DOCS[0],
            extra_body={"embedding_type": "multivector", "multivector_dtype": "binary"},
        )
        body = c.post("/v1/embeddings", json={"input": DOCS, "embedding_type": "multivector"}).json()
        b64 = c.post(
            "/v1/embeddings",
            json={"input": DOCS, "embedding_type": "multivector", "encoding_format": "base64"},
        ).json()
        plain = c.post("/v1/embeddings", json={"input": DOCS[0]})
    for d, w in zip(resp.data, want, strict=True):
        # the client decodes the base64 blob as flat float32: `shape` (kept as an extra field) restores it
        got = np.array(d.embedding, dtype=np.float32).reshape(d.model_extra["shape"])
        assert np.array_equal(got, w)
    codes = quantize(want[0], "binary", None)
    for d in compressed.data:  # compressed: the same, the codes' values as floats
        assert np.array_equal(np.array(d.embedding).reshape(d.model_extra["shape"]), codes)
    for d, e, w in zip(body["data"], b64["data"], want, strict=True):
        assert np.array_equal(np.array(d["embedding"], dtype=np.float32), w)
        blob = np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4").reshape(e["shape"])
        assert np.array_equal(blob, w) and d["shape"] == [w.shape[0], 128] == e["shape"]
        assert d["num_tokens"] >= w.shape[0] and d["truncated"] is False
    assert body["model_version"] and body["embedding_schema"] == b64["embedding_schema"]
    # a ColBERT model answers multi-vectors only, and says so
    assert plain.status_code == 400 and "multivector" in plain.json()["error"]["message"]


def test_query_side_dimensions_and_compressed_types(colbert: Path) -> None:
    with server_client(colbert) as c:
        engine = runtime_of(c).engine
        assert engine is not None
        query = c.post(
            "/v1/embeddings",
            json={"input": "what is python?", "embedding_type": "multivector", "input_type": "query"},
        ).json()
        assert query["data"][0]["shape"] == [32, 128]  # expanded to the model's query length
        want = embed_multivector(engine, DOCS[0], dimensions=32)[0]
        for kind in ("int8", "binary"):
            got = c.post(
                "/v1/embeddings",
                json={
                    "input": DOCS[0],
                    "embedding_type": "multivector",
                    "multivector_dtype": kind,
                    "dimensions": 32,
                },
            ).json()
            expect = quantize(want, kind, runtime_of(c).service.calibration)  # type: ignore[union-attr]
            assert np.array_equal(np.array(got["data"][0]["embedding"]), expect)
            assert got["data"][0]["shape"] == list(expect.shape)
            # base64 is float32 of the codes (what the openai client decodes); base64_bytes their bytes
            blobs = {
                fmt: c.post(
                    "/v1/embeddings",
                    json={"input": DOCS[0], "embedding_type": "multivector", "multivector_dtype": kind,
                          "dimensions": 32, "encoding_format": fmt},
                ).json()["data"][0]["embedding"]
                for fmt in ("base64", "base64_bytes")
            }  # fmt: skip
            as_floats = np.frombuffer(base64.b64decode(blobs["base64"]), dtype="<f4").reshape(expect.shape)
            assert np.array_equal(as_floats, expect)
            assert np.array_equal(
                np.frombuffer(base64.b64decode(blobs["base64_bytes"]), dtype=expect.dtype), expect.ravel()
            )
        schemas = {
            c.post(
                "/v1/embeddings", json={"input": DOCS[0], "embedding_type": "multivector", **extra}
            ).json()["embedding_schema"]
            for extra in ({}, {"multivector_dtype": "int8"}, {"dimensions": 32})
        }
        assert len(schemas) == 3
        model = c.get("/v1/models").json()["data"][0]
        assert model["dimensions"] == 128 and model["multivector_dimensions"] == 128
        assert model["pooling"] == "multivector" and model["embedding_schema"] == schemas_of_float(c)


def test_cohere_v2_embed_gives_the_token_vectors_of_each_side(colbert: Path, qwen3_dir: Path) -> None:
    with server_client(colbert) as c:
        engine = runtime_of(c).engine
        assert engine is not None
        query = c.post("/v2/embed", json={"texts": ["river"], "input_type": "search_query",
                                          "embedding_types": ["multivector"]}).json()  # fmt: skip
        docs = c.post("/v2/embed", json={"texts": DOCS, "embedding_types": ["multivector"]}).json()
        mixed = c.post("/v2/embed", json={"texts": DOCS, "embedding_types": ["float", "multivector"]})
        want_query = embed_multivector(engine, "river", input_type="query")[0]
        want_docs = embed_multivector(engine, DOCS)
    assert np.array_equal(np.array(query["embeddings"]["multivector"][0], dtype=np.float32), want_query)
    for got, want in zip(docs["embeddings"]["multivector"], want_docs, strict=True):
        np.testing.assert_allclose(np.array(got), want, atol=1e-6)
    assert mixed.status_code == 400 and "['multivector'] only" in mixed.json()["error"]["message"]
    with server_client(qwen3_dir) as c:
        resp = c.post("/v2/embed", json={"texts": ["hi"], "embedding_types": ["float", "multivector"]})
        assert resp.status_code == 400 and "one vector per input" in resp.json()["error"]["message"]


def schemas_of_float(c: TestClient) -> str:
    """The schema of the model's plain multi-vectors, as an answer carries it."""
    body = {"input": DOCS[0], "embedding_type": "multivector"}
    return str(c.post("/v1/embeddings", json=body).json()["embedding_schema"])


def test_rerank_by_maxsim_equals_the_vectors(colbert: Path) -> None:
    with server_client(colbert) as c:
        engine = runtime_of(c).engine
        assert engine is not None
        query = "Which river flows through Berlin?"
        q = embed_multivector(engine, query, input_type="query")[0]
        docs = embed_multivector(engine, DOCS)
        resp = c.post("/v1/rerank", json={"query": query, "documents": DOCS, "top_n": 2})
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
    want = sorted(((maxsim(q, d), i) for i, d in enumerate(docs)), key=lambda x: (-x[0], x[1]))[:2]
    assert [r["index"] for r in results] == [i for _, i in want]
    for r, (score, _) in zip(results, want, strict=True):
        assert r["relevance_score"] == pytest.approx(score, rel=1e-6)


def test_refusals_name_the_problem_and_the_server_keeps_answering(colbert: Path, qwen3_dir: Path) -> None:
    with server_client(colbert, max_output_vectors=20) as c:
        cases = [
            ({"input": DOCS, "embedding_type": "multivector"}, 413, "--max-output-vectors"),
            ({"input": DOCS[0], "embedding_type": "multivector", "dimensions": 129}, 400, "dimensions"),
            ({"input": DOCS[0], "input_type": "query"}, 422, "embedding_type 'multivector'"),
            ({"input": DOCS[0], "embedding_type": "multivector", "input_type": "passage"}, 422, "input_type"),
            ({"input": DOCS, "embedding_type": "multivector", "late_chunking": True}, 422, "late_chunking"),
        ]
        for body, status, words in cases:
            resp = c.post("/v1/embeddings", json=body)
            assert resp.status_code == status, (body, resp.text)
            assert words in resp.json()["error"]["message"]
        score = c.post("/v1/score", json={"text_1": "a", "text_2": ["b"]})
        assert score.status_code == 400 and "multi-vector" in score.json()["error"]["message"]
        ok = c.post("/v1/embeddings", json={"input": DOCS[0], "embedding_type": "multivector"})
        assert ok.status_code == 200 and ok.json()["data"][0]["shape"][0] <= 20
    with server_client(qwen3_dir) as c:
        resp = c.post("/v1/embeddings", json={"input": "hi", "embedding_type": "multivector"})
        assert resp.status_code == 400 and "one vector per input" in resp.json()["error"]["message"]
        assert c.post("/v1/embeddings", json={"input": "hi"}).status_code == 200


def test_through_the_gateway_counts_each_side_and_reranks_whole(colbert: Path) -> None:
    """The gateway counts a document with its side's prompt and a query with its expansion (no
    count mismatch with the pools), places each input by that count and sends a MaxSim rerank
    whole to one pool."""
    long_doc = "The Spree flows through Berlin. " * 12
    with server_client(colbert) as c:
        direct = c.post("/v1/rerank", json={"query": "river", "documents": [*DOCS, long_doc]}).json()
        with TestClient(gateway_app(c.app, colbert)) as g:
            docs = g.post(
                "/v1/embeddings", json={"input": [DOCS[0], long_doc], "embedding_type": "multivector"}
            )
            query = g.post(
                "/v1/embeddings",
                json={"input": "river", "embedding_type": "multivector", "input_type": "query"},
            )
            rerank = g.post("/v1/rerank", json={"query": "river", "documents": [*DOCS, long_doc]})
            v2 = g.post("/v2/embed", json={"texts": ["river"], "input_type": "search_query",
                                           "embedding_types": ["multivector"]})  # fmt: skip
            mismatches = g.get("/metrics").text
    assert docs.status_code == 200 and [d["pool"] for d in docs.json()["data"]] == ["short", "long"]
    assert query.json()["data"][0]["shape"] == [32, 128]
    assert v2.status_code == 200 and len(v2.json()["embeddings"]["multivector"][0]) == 32
    assert rerank.status_code == 200 and rerank.json()["results"] == direct["results"]
    assert not [
        line
        for line in mismatches.splitlines()
        if line.startswith("embedserve_gateway_count_mismatches") and not line.endswith(" 0.0")
    ]


def test_image_inputs_of_a_vision_language_multivector_model(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    """A content item with a data-URI image answers the vectors of every position, image tokens
    included, equal to the engine's for the decoded image."""
    from PIL import Image

    from tests.helpers.tiny_multivector import decoder_colbert
    from tests.helpers.tiny_vl import encoded, image

    path = decoder_colbert(qwen3_vl_dir, tmp_path / "colqwen", dim=32)
    png = encoded(image(128, 96, seed=1))
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    content = [{"type": "text", "text": "a chart: "}, {"type": "image_url", "image_url": {"url": url}}]
    with server_client(path) as c:
        engine = runtime_of(c).engine
        assert engine is not None
        resp = c.post(
            "/v1/embeddings", json={"input": [{"content": content}], "embedding_type": "multivector"}
        )
        assert resp.status_code == 200, resp.text
        want = embed_multivector(engine, [["a chart: ", Image.open(io.BytesIO(png)).convert("RGB")]])[0]
    got = np.array(resp.json()["data"][0]["embedding"], dtype=np.float32)
    assert got.shape == want.shape and got.shape[0] > 20
    np.testing.assert_allclose(got, want, atol=1e-6)
