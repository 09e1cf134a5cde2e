"""`/v2/embed`, `/v1/rerank` and X-Request-Timeout through the Ray Serve ingress, without Ray: the
ingress's gateway service (scale/ingress.py) over handles that run the replica's code
(scale/replica.py) on a real server. Answers equal the server's own, refusals are the gateway's,
the replica is told the time left, and a deadline passing in a pool reaches the client once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from embedserve.gateway.service import POOLS_HEADER
from tests.helpers.inprocess import LocalReplica, ingress_app, runtime_of, server_client, slow_steps
from tests.helpers.route_checks import (
    COHERE_REFUSALS,
    QUERY,
    RERANK_BODY,
    assert_rerank_refusals,
    assert_same_cohere,
    assert_same_ranking,
)
from tests.helpers.server_process import words
from tests.helpers.tiny_rerankers import build_cross_encoder

pytest.importorskip("ray")
from embedserve.scale.replica import answer

Ingress = tuple[TestClient, dict[str, LocalReplica]]


@pytest.fixture(scope="module")
def embed_server(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, max_inputs_per_request=8) as c:
        yield c


@pytest.fixture(scope="module")
def ingress(embed_server: TestClient, qwen3_dir: Path) -> Ingress:
    app, replicas = ingress_app(embed_server, qwen3_dir, max_inputs_per_request=4, request_timeout_s=30)
    return TestClient(app), replicas


def test_cohere_embed_is_split_per_pool_as_the_gateway_splits_it(
    ingress: Ingress, embed_server: TestClient
) -> None:
    client, replicas = ingress
    for texts, pools in (([words(3), words(5)], ["short"]), ([words(3), words(200)], ["short", "long"])):
        # output_dimension and int8 name other schemas than the pool's: still the pool's vectors
        body = {"texts": texts, "input_type": "search_query", "embedding_types": ["float", "int8"]}
        body["output_dimension"] = 32
        before = {name: len(r.calls) for name, r in replicas.items()}
        resp = client.post("/v2/embed", json=body)
        assert resp.status_code == 200, resp.text
        assert resp.headers[POOLS_HEADER] == ",".join(pools) and "x-total-time" in resp.headers
        assert {name: len(r.calls) - before[name] for name, r in replicas.items()} == {
            name: int(name in pools) for name in replicas
        }
        for pool in pools:
            path, told = replicas[pool].calls[-1]
            assert path == "/v2/embed" and told is not None and 25 < told <= 30  # request_timeout_s
        got, direct = resp.json(), embed_server.post("/v2/embed", json=body).json()
        assert_same_cohere(got, direct, ["float", "int8"])
        assert got["embedding_schema"] == direct["embedding_schema"] and got["model"] == direct["model"]


@pytest.mark.parametrize(("body", "status", "message"), COHERE_REFUSALS)
def test_cohere_refusals(ingress: Ingress, body: dict[str, Any], status: int, message: str) -> None:
    resp = ingress[0].post("/v2/embed", json=body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]


def test_the_clients_timeout_header_bounds_what_the_replica_is_told(ingress: Ingress) -> None:
    client, replicas = ingress
    for path, body in (("/v1/embeddings", {"input": "x"}), ("/v2/embed", {"texts": ["x"]})):
        resp = client.post(path, json=body, headers={"X-Request-Timeout": "2.5"})
        assert resp.status_code == 200, resp.text
        told = replicas["short"].calls[-1][1]
        assert told is not None and 2.0 < told < 2.5, told
    bad = client.post("/v2/embed", json={"texts": ["x"]}, headers={"X-Request-Timeout": "soon"})
    assert bad.status_code == 400 and "x-request-timeout" in bad.json()["error"]["message"]


def test_a_deadline_passing_in_a_pool_reaches_the_client_once(
    ingress: Ingress, embed_server: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, replicas = ingress
    before = {name: len(r.calls) for name, r in replicas.items()}
    with slow_steps(embed_server, monkeypatch):  # each engine step takes 2 s
        start = time.monotonic()
        resp = client.post("/v2/embed", json={"texts": ["slow"]}, headers={"X-Request-Timeout": "1"})
        waited = time.monotonic() - start
    error = resp.json()["error"]
    assert resp.status_code == 504 and error["type"] == "deadline_exceeded", resp.text
    assert "pool 'short'" in error["message"] and "not retried" in error["message"]
    assert waited < 1.9, waited  # the deadline, not the 2 s step
    # One call to the short pool's replica; never re-sent to the long pool.
    assert (
        len(replicas["short"].calls) == before["short"] + 1 and len(replicas["long"].calls) == before["long"]
    )


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/embeddings", {"input": ["a text", "another"]}),
        ("/v2/embed", {"texts": ["a text", "another"]}),
    ],
)
def test_the_replica_runs_the_servers_handler_within_the_time_it_is_told(
    embed_server: TestClient, path: str, payload: dict[str, Any]
) -> None:
    runtime = runtime_of(embed_server)
    assert runtime.service is not None
    ok = asyncio.run(answer(runtime, runtime.metrics, path, payload, 30.0))
    assert ok["status"] == 200 and ok["embedding_schema"] == runtime.service.metadata.schema()
    direct = embed_server.post(path, json=payload).json()
    assert ok["body"].keys() == direct.keys()
    late = asyncio.run(answer(runtime, runtime.metrics, path, payload, 1e-6))
    assert late["status"] == 503 and late["body"]["error"]["type"] == "deadline_exceeded", late
    assert "x-request-timeout" in late["body"]["error"]["message"]


def test_the_replica_refuses_as_the_server_does(embed_server: TestClient) -> None:
    runtime = runtime_of(embed_server)

    def status(path: str, payload: dict[str, Any]) -> tuple[int, str]:
        reply = asyncio.run(answer(runtime, runtime.metrics, path, payload, None))
        return reply["status"], reply["body"]["error"]["message"]

    assert status("/v2/embed", {"texts": "not a list"})[0] == 422
    assert status("/v1/embeddings", {"input": "x", "dimensions": 10**6})[0] == 400
    assert "is an embedding model" in status("/v1/rerank", {"query": "q", "documents": ["d"]})[1]
    assert status("/v1/completions", {})[0] == 404


@pytest.fixture(scope="module")
def rerank_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Ingress]]:
    ce_dir = build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")
    engine = {"max_model_len": 128, "max_num_batched_tokens": 512}
    with server_client(ce_dir, engine=EngineOptions(**engine), max_inputs_per_request=8) as server:
        pools = {"short": {"max_tokens": 64}, "long": {"max_tokens": 128}}
        app, replicas = ingress_app(server, ce_dir, pools=pools)
        yield server, (TestClient(app), replicas)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_through_the_ingress_is_the_servers_answer(
    rerank_pair: tuple[TestClient, Ingress], path: str
) -> None:
    server, (client, replicas) = rerank_pair
    resp = client.post(path, json=RERANK_BODY)
    assert resp.status_code == 200, resp.text
    assert resp.headers[POOLS_HEADER] == "short"  # every pair fits 64 tokens
    assert replicas["short"].calls[-1][0] == "/v1/rerank"
    assert_same_ranking(resp.json(), server.post("/v1/rerank", json=RERANK_BODY).json())
    long = client.post("/v1/rerank", json={"query": QUERY, "documents": ["lift", words(90)]})
    assert long.status_code == 200 and long.headers[POOLS_HEADER] == "long", long.text


def test_rerank_refusals_through_the_ingress(rerank_pair: tuple[TestClient, Ingress]) -> None:
    server, (client, _) = rerank_pair
    assert_rerank_refusals(client)
    # The replica's handler honours its deadline on /v1/rerank too.
    runtime = runtime_of(server)
    payload = {"query": "q", "documents": ["d"]}
    late = asyncio.run(answer(runtime, runtime.metrics, "/v1/rerank", payload, 1e-6))
    assert late["status"] == 503 and late["body"]["error"]["type"] == "deadline_exceeded", late
