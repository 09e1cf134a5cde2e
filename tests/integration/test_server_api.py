"""The OpenAI-compatible API of a real server process: vectors equal the engine's own."""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from embedserve import Engine
from tests.helpers.reference import cosine
from tests.helpers.server_process import ServerProcess
from tests.integration.conftest import API_KEY, MAX_MODEL_LEN, MODEL_NAME

TEXTS = ["hello world", "Paged attention stores keys and values in blocks.", "ein kurzer deutscher Satz"]


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def _vectors(resp: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    assert [d.index for d in resp.data] == list(range(len(resp.data)))
    return np.array([_decode(d.embedding) for d in resp.data], dtype=np.float32)


def _decode(embedding: list[float] | str) -> np.ndarray:
    if isinstance(embedding, str):  # asked for base64 explicitly: the client hands it over as is
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert cosine(got, want).min() >= 0.99999


def test_readiness_is_503_until_warm_up_completes_while_liveness_answers(api_server: ServerProcess) -> None:
    answered = [(live, ready) for live, ready in api_server.startup if live or ready]
    assert answered, "the server never answered while starting"
    assert all(live == 200 for live, _ in answered)  # liveness answers throughout
    assert answered[0][1] == 503 and answered[-1][1] == 200
    assert "warm-up done" in api_server.log()


# None: the client's default, which requests base64 and decodes it itself.
@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_openai_client_vectors_equal_engine(
    api_server: ServerProcess, ref_engine: Engine, encoding_format: str | None
) -> None:
    fmt: Any = {"encoding_format": encoding_format} if encoding_format else {}
    resp = _client(api_server).embeddings.create(model=MODEL_NAME, input=TEXTS, **fmt)
    _assert_same(_vectors(resp), ref_engine.embed(TEXTS))
    assert resp.model == MODEL_NAME
    assert resp.usage.prompt_tokens == sum(len(t.token_ids) for t in ref_engine.renderer.text(TEXTS))
    extra = resp.model_extra or {}
    assert extra["backend_profile"] == "cpu-fp32" and extra["dtype"] == "float32"
    assert extra["model_version"] and extra["embedding_schema"].startswith("es1-")


def test_openai_client_token_ids_dimensions_and_prompt_name(
    api_server: ServerProcess, ref_engine: Engine
) -> None:
    client = _client(api_server)
    ids = [t.token_ids for t in ref_engine.renderer.text(TEXTS[:2])]
    one = client.embeddings.create(model=MODEL_NAME, input=ids[0], encoding_format="float")
    _assert_same(_vectors(one), ref_engine.embed([ids[0]]))
    many = client.embeddings.create(model=MODEL_NAME, input=ids, dimensions=16, encoding_format="float")
    _assert_same(_vectors(many), ref_engine.embed(ids, dimensions=16))
    assert np.allclose(np.linalg.norm(_vectors(many), axis=1), 1.0, atol=1e-5)  # sliced, then normalized
    query = client.embeddings.create(model=MODEL_NAME, input=TEXTS[:1], extra_body={"prompt_name": "query"})
    _assert_same(_vectors(query), ref_engine.embed(TEXTS[:1], prompt_name="query"))
    assert cosine(_vectors(query), ref_engine.embed(TEXTS[:1]))[0] < 0.9999  # the prompt mattered


def test_raw_http_base64_metadata_and_timing_headers(api_server: ServerProcess, ref_engine: Engine) -> None:
    """What `curl` sees: little-endian float32 base64, metadata fields, timing headers."""
    body = json.dumps({"input": "hello world", "encoding_format": "base64", "normalize": False}).encode()
    req = urllib.request.Request(
        api_server.base_url + "/v1/embeddings",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        headers, payload = resp.headers, json.loads(resp.read())
    vec = np.frombuffer(base64.b64decode(payload["data"][0]["embedding"]), dtype="<f4")
    _assert_same(vec[None], ref_engine.embed(["hello world"], normalize=False))
    assert abs(float(np.linalg.norm(vec)) - 1.0) > 1e-3  # really not normalized
    for h in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time"):
        assert float(headers[h]) >= 0.0
    assert payload["data"][0]["num_tokens"] == 3 and payload["data"][0]["truncated"] is False

    models = httpx.get(
        api_server.base_url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}
    ).json()
    card = models["data"][0]
    assert card["id"] == MODEL_NAME and card["max_model_len"] == MAX_MODEL_LEN
    # The listing reports the default options' schema; turning off normalization changes it.
    assert card["model_version"] == payload["model_version"]
    assert card["embedding_schema"] != payload["embedding_schema"]
    default = _client(api_server).embeddings.create(model=MODEL_NAME, input="hello world")
    assert (default.model_extra or {})["embedding_schema"] == card["embedding_schema"]


# CI time (2026-12-07): "end" runs in CI, "start" with `-m slow`
@pytest.mark.parametrize("side", ["end", pytest.param("start", marks=pytest.mark.slow)])
def test_truncation_is_applied_only_when_asked_and_reported(
    api_server: ServerProcess, ref_engine: Engine, side: str
) -> None:
    long_text = " ".join(f"token{i % 97}" for i in range(MAX_MODEL_LEN))
    resp = httpx.post(
        api_server.base_url + "/v1/embeddings",
        json={"input": [long_text, "short"], "truncate": side},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    items = resp.json()["data"]
    assert [i["truncated"] for i in items] == [True, False]
    assert items[0]["num_tokens"] == MAX_MODEL_LEN
    want = ref_engine.embed([long_text, "short"], truncate=side)
    _assert_same(np.array([i["embedding"] for i in items], dtype=np.float32), want)
