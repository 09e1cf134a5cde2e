"""`/v2/embed` and `/v1/rerank` through the gateway, in-process over real servers: `/v2/embed`
split per text by token count and reassembled, a rerank placed whole on the pool that fits its
longest pair; answered as the server answers, errors mapped; an unknown path is a 404 naming the
gateway's routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from embedserve.gateway.service import POOLS_HEADER
from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.route_checks import (
    COHERE_REFUSALS,
    QUERY,
    RERANK_BODY,
    assert_rerank_refusals,
    assert_same_ranking,
)
from tests.helpers.server_process import words
from tests.helpers.tiny_rerankers import build_cross_encoder


@pytest.fixture(scope="module")
def embed_server(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, max_inputs_per_request=8) as c:
        yield c


@pytest.fixture(scope="module")
def gateway(embed_server: TestClient, qwen3_dir: Path) -> TestClient:
    return TestClient(gateway_app(embed_server.app, qwen3_dir, max_inputs_per_request=4))


KINDS = ["float", "int8", "binary", "base64"]


@pytest.mark.parametrize(
    ("texts", "pools"),
    [
        ([words(3), words(5)], "short"),
        ([words(200)], "long"),
        ([words(3), words(200), words(5, seed=1), words(300, seed=2)], "short,long"),  # split
        ([words(200), words(3)], "long,short"),  # pools named in the order of their first text
    ],
)
def test_cohere_embed_is_split_by_token_count_and_reassembled_in_order(
    gateway: TestClient, embed_server: TestClient, texts: list[str], pools: str
) -> None:
    body = {"texts": texts, "input_type": "search_query", "embedding_types": KINDS, "output_dimension": 32}
    resp = gateway.post("/v2/embed", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers[POOLS_HEADER] == pools and "x-total-time" in resp.headers
    direct = embed_server.post("/v2/embed", json=body).json()  # the whole request on one server
    got = resp.json()
    assert got["response_type"] == "embeddings_by_type" and got["texts"] == texts
    assert list(got["embeddings"]) == KINDS
    for key in ("embedding_schema", "embedding_schemas", "model_version", "dtype", "backend_profile"):
        assert got[key] == direct[key], key
    assert got["meta"] == direct["meta"]  # billed input tokens summed over the parts
    for kind in KINDS:
        assert len(got["embeddings"][kind]) == len(texts)
        if kind == "float":
            assert np.allclose(got["embeddings"][kind], direct["embeddings"][kind], atol=1e-5)
        elif kind == "int8":
            assert np.abs(np.subtract(got["embeddings"][kind], direct["embeddings"][kind])).max() <= 1
    # each text's vector is its own, in its place: equal to the server's answer for it alone
    for i, text in enumerate(texts):
        alone = embed_server.post("/v2/embed", json={**body, "texts": [text]}).json()
        assert np.allclose(got["embeddings"]["float"][i], alone["embeddings"]["float"][0], atol=1e-5)


@pytest.mark.parametrize(("body", "status", "message"), COHERE_REFUSALS)
def test_cohere_refusals(gateway: TestClient, body: dict[str, Any], status: int, message: str) -> None:
    resp = gateway.post("/v2/embed", json=body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]


def test_rerank_on_an_embedding_gateway_is_refused_before_any_pool(gateway: TestClient) -> None:
    resp = gateway.post("/v1/rerank", json={"query": "q", "documents": ["d"]})
    assert resp.status_code == 400 and "is an embedding model" in resp.json()["error"]["message"]


def test_an_unknown_path_names_the_gateways_routes(gateway: TestClient) -> None:
    resp = gateway.post("/v1/completions", json={})
    message = resp.json()["error"]["message"]
    assert resp.status_code == 404 and "not a route of this gateway" in message
    assert all(p in message for p in ("/v1/embeddings", "/v2/embed", "/v1/rerank"))
    assert gateway.get("/v1/embeddings").status_code == 405  # a known path, wrong method


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")


@pytest.fixture(scope="module")
def rerank_pair(ce_dir: Path) -> Iterator[tuple[TestClient, TestClient]]:
    engine = {"max_model_len": 128, "max_num_batched_tokens": 512}
    with server_client(ce_dir, engine=EngineOptions(**engine), max_inputs_per_request=8) as server:
        pools = {  # the long pool at the model's 128 tokens (a pool over it leaves rotation)
            "short": {"max_tokens": 64, "upstreams": ["http://short:1"]},
            "long": {"max_tokens": 128, "upstreams": ["http://long:2"]},
        }
        yield server, TestClient(gateway_app(server.app, ce_dir, pools=pools))


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_through_the_gateway_is_the_servers_answer(
    rerank_pair: tuple[TestClient, TestClient], path: str
) -> None:
    server, gateway = rerank_pair
    resp = gateway.post(path, json=RERANK_BODY)
    assert resp.status_code == 200, resp.text
    assert resp.headers[POOLS_HEADER] == "short"  # every pair fits 64 tokens
    assert_same_ranking(resp.json(), server.post("/v1/rerank", json=RERANK_BODY).json())
    long = gateway.post("/v1/rerank", json={"query": QUERY, "documents": ["lift", words(90)]})
    assert long.status_code == 200 and long.headers[POOLS_HEADER] == "long", long.text


def test_rerank_refusals_through_the_gateway(rerank_pair: tuple[TestClient, TestClient]) -> None:
    assert_rerank_refusals(rerank_pair[1])
