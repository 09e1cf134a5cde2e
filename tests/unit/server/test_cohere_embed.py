"""`/v2/embed` (Cohere's shape) and compressed types on `/v1/embeddings`, in-process.

Every compressed type is checked against sentence-transformers' quantize_embeddings applied to
the float vectors the same server returns; Cohere's own client is pointed at the app.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sentence_transformers.util import quantize_embeddings

from embedserve.engine.options import EngineOptions
from embedserve.server.app import create_app
from embedserve.server.runtime import ServerSettings

TEXTS = ["what is a wing?", "the boundary layer of a flat plate", "shock waves"]


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    app = create_app(
        ServerSettings(
            model=str(qwen3_dir),
            engine=EngineOptions(max_model_len=256),
            warmup_lengths=(16,),
            int8_scale=0.5,
        )
    )
    with TestClient(app) as c:
        deadline = time.monotonic() + 60
        while c.get("/health/ready").status_code != 200:
            assert time.monotonic() < deadline, c.get("/health/ready").json()
            time.sleep(0.05)
        yield c


def _floats(client: TestClient, **extra: Any) -> np.ndarray:
    resp = client.post("/v1/embeddings", json={"input": TEXTS, **extra})
    assert resp.status_code == 200, resp.text
    return np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)


def test_every_embedding_type_matches_quantize_embeddings(client: TestClient) -> None:
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    resp = client.post(
        "/v2/embed", json={"texts": TEXTS, "input_type": "search_document", "embedding_types": kinds}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["response_type"] == "embeddings_by_type" and body["texts"] == TEXTS
    assert body["meta"]["billed_units"]["input_tokens"] > 0
    floats = _floats(client, prompt="")
    got = body["embeddings"]
    assert np.allclose(np.array(got["float"], dtype=np.float32), floats, atol=1e-6)
    dim = floats.shape[1]
    ranges = np.vstack((np.full(dim, -0.5), np.full(dim, 0.5))).astype(np.float32)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        ref = quantize_embeddings(floats, kind, ranges=ranges)  # type: ignore[arg-type]
        assert np.array_equal(np.array(got[kind]), ref), kind
    schemas = body["embedding_schemas"]
    assert len(set(schemas.values())) == 5  # base64 is float: same vector space
    assert schemas["float"] == schemas["base64"] == body["embedding_schema"]


def test_input_type_selects_the_prompt(client: TestClient) -> None:
    q = client.post("/v2/embed", json={"texts": TEXTS, "input_type": "search_query"}).json()
    assert np.allclose(q["embeddings"]["float"], _floats(client, prompt_name="query"), atol=1e-6)
    c = client.post("/v2/embed", json={"texts": TEXTS, "input_type": "clustering"}).json()
    assert np.allclose(c["embeddings"]["float"], _floats(client, prompt=""), atol=1e-6)


def test_compressed_types_through_v1_embeddings(client: TestClient) -> None:
    floats = _floats(client)
    resp = client.post("/v1/embeddings", json={"input": TEXTS, "embedding_type": "binary"})
    assert resp.status_code == 200, resp.text
    ref = quantize_embeddings(floats, "binary")
    assert np.array_equal(np.array([d["embedding"] for d in resp.json()["data"]]), ref)
    plain = client.post("/v1/embeddings", json={"input": TEXTS}).json()
    assert resp.json()["embedding_schema"] != plain["embedding_schema"]
    ints = client.post("/v1/embeddings", json={"input": TEXTS, "embedding_type": "int8"}).json()
    codes = np.array([d["embedding"] for d in ints["data"]], dtype=np.int8)
    assert np.array_equal(
        codes,
        quantize_embeddings(floats, "int8", ranges=np.array([[-0.5], [0.5]]).repeat(floats.shape[1], 1)),
    )

    def blobs(fmt: str, dtype: str) -> np.ndarray:
        body = {"input": TEXTS, "embedding_type": "int8", "encoding_format": fmt}
        data = client.post("/v1/embeddings", json=body).json()["data"]
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=dtype) for d in data])

    # base64 is OpenAI's float32 whatever the type; base64_bytes the codes' own bytes
    assert np.array_equal(blobs("base64", "<f4"), codes.astype(np.float32))
    assert np.array_equal(blobs("base64_bytes", "i1"), codes)


@pytest.mark.parametrize("kind", ["int8", "uint8", "binary", "ubinary"])
def test_the_openai_client_gets_compressed_vectors_right(client: TestClient, kind: str) -> None:
    """The openai client asks for base64 by default and decodes it as float32: it must get the
    same integers as a JSON answer, not bytes read as floats."""
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)
    got = oa.embeddings.create(model="qwen3", input=TEXTS, extra_body={"embedding_type": kind})
    want = client.post("/v1/embeddings", json={"input": TEXTS, "embedding_type": kind}).json()
    assert [d.embedding for d in got.data] == [d["embedding"] for d in want["data"]]


@pytest.mark.parametrize(
    "body",
    [
        {"texts": []},
        {"texts": ["a"], "embedding_types": ["float16"]},
        {"texts": ["a"], "input_type": "search"},
        {"texts": ["a"], "truncate": "MIDDLE"},
        {"texts": ["a"], "output_dimension": 0},
    ],
)
def test_bad_cohere_requests_are_422(client: TestClient, body: dict[str, Any]) -> None:
    assert client.post("/v2/embed", json=body).status_code == 422


def test_truncate_none_refuses_an_over_long_text(client: TestClient) -> None:
    long = "word " * 1000
    refused = client.post("/v2/embed", json={"texts": [long], "truncate": "NONE"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].endswith("pass truncate 'END' / 'START'")  # Cohere's values
    openai = client.post("/v1/embeddings", json={"input": long})
    assert openai.json()["error"]["message"].endswith("pass truncate='end' / 'start'")
    assert client.post("/v2/embed", json={"texts": [long], "truncate": "END"}).status_code == 200


def test_the_cohere_client_works_unchanged(client: TestClient) -> None:
    cohere = pytest.importorskip("cohere")
    co = cohere.ClientV2(api_key="unused", base_url=str(client.base_url), httpx_client=client)
    res = co.embed(
        texts=TEXTS, model="qwen3", input_type="search_query", embedding_types=["float", "int8", "ubinary"]
    )
    floats = _floats(client, prompt_name="query")
    assert np.allclose(np.array(res.embeddings.float_), floats, atol=1e-6)
    assert len(res.embeddings.ubinary[0]) == (floats.shape[1] + 7) // 8
