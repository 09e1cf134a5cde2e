"""The serving template (server/pipeline.py) refuses alike on every route: the same wrong-task,
404-model, input-limit, 413 and 429 bodies (their numbers aside) on `/v1/embeddings`,
`/v2/embed` and `/v1/rerank`, on a server (in-process) and on a Ray Serve replica's handler, and
the admitted work is released whatever the outcome."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from embedserve.scale.replica import answer as replica_answer
from tests.helpers.inprocess import runtime_of, server_client
from tests.helpers.server_process import words
from tests.helpers.tiny_rerankers import build_cross_encoder

LIMITS = {"max_inputs_per_request": 2, "max_queued_tokens": 40}


def embeddings(texts: list[str], **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/embeddings", {"input": texts, "prompt": "", **extra}


def cohere(texts: list[str], **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v2/embed", {"texts": texts, **extra}


def rerank(texts: list[str], **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/rerank", {"query": "q", "documents": texts, **extra}


@pytest.fixture(scope="module")
def embed_server(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, **LIMITS) as c:
        yield c


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    ce_dir = build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")
    with server_client(ce_dir, **LIMITS) as c:
        yield c


def _same_shape(error: dict[str, Any]) -> dict[str, Any]:
    """The error body with its counts (not the digits of a path or a name) and the server's model
    name taken out."""
    message = re.sub(r"serves '[\w.-]+'$", "serves MODEL", error["error"]["message"])
    return {**error["error"], "message": re.sub(r"(?<![/\w])\d+", "N", message)}


def _refusals(client: TestClient, requests: list[tuple[str, dict[str, Any]]], status: int) -> list[Any]:
    """Each request refused with `status` (Retry-After where it is 429): the body, made comparable."""
    out = []
    for path, body in requests:
        resp = client.post(path, json=body)
        assert resp.status_code == status, (path, resp.text)
        if status == 429:
            assert int(resp.headers["retry-after"]) >= 1
        out.append(_same_shape(resp.json()))
    return out


def _all_equal(bodies: list[Any]) -> None:
    assert all(b == bodies[0] for b in bodies), bodies


def test_wrong_task_is_refused_alike(embed_server: TestClient, rerank_server: TestClient) -> None:
    (on_embedder,) = _refusals(embed_server, [rerank(["d"])], 400)
    assert on_embedder["message"].endswith("is an embedding model: POST /v1/embeddings")
    on_reranker = _refusals(rerank_server, [embeddings(["t"]), cohere(["t"])], 400)
    _all_equal(on_reranker)
    assert on_reranker[0]["message"].endswith("is a reranker: POST /v1/rerank")


def test_an_unknown_model_is_404_alike_and_clipped(
    embed_server: TestClient, rerank_server: TestClient
) -> None:
    model = "x" * 1000
    bodies = _refusals(embed_server, [embeddings(["t"], model=model), cohere(["t"], model=model)], 404)
    bodies += _refusals(rerank_server, [rerank(["d"], model=model)], 404)
    _all_equal(bodies)
    assert bodies[0]["type"] == "not_found_error" and len(bodies[0]["message"]) < 150
    # /v1/models/{id} says it the same way
    (card,) = _refusals_get(embed_server, f"/v1/models/{model}")
    assert card == bodies[0]


def _refusals_get(client: TestClient, path: str) -> list[Any]:
    resp = client.get(path)
    assert resp.status_code == 404, resp.text
    return [_same_shape(resp.json())]


def test_the_input_limit_is_the_same_on_every_route(
    embed_server: TestClient, rerank_server: TestClient
) -> None:
    three = ["a", "b", "c"]
    bodies = _refusals(embed_server, [embeddings(three), cohere(three)], 400)
    bodies += _refusals(rerank_server, [rerank(three)], 400)
    _all_equal(bodies)
    assert bodies[0]["message"] == "N inputs in one request; the limit is N"


def test_a_request_that_can_never_fit_is_413_alike(
    embed_server: TestClient, rerank_server: TestClient
) -> None:
    long = [words(60)]  # over the 40 queued tokens on its own
    bodies = _refusals(embed_server, [embeddings(long), cohere(long)], 413)
    bodies += _refusals(rerank_server, [rerank(long)], 413)
    _all_equal(bodies)
    assert "split it" in bodies[0]["message"]


def test_a_full_queue_is_429_alike_and_releases_nothing_it_did_not_take(
    embed_server: TestClient, rerank_server: TestClient
) -> None:
    bodies = []
    for client, requests in (
        (embed_server, [embeddings(["hello"]), cohere(["hello"])]),
        (rerank_server, [rerank(["hello"])]),
    ):
        service = runtime_of(client).service
        assert service is not None
        admission = service.admission
        held = admission.try_admit(1, admission.max_tokens - 1)  # the queue all but full
        assert held is not None
        try:
            bodies += _refusals(client, requests, 429)
            assert (admission.inputs, admission.tokens) == (1, admission.max_tokens - 1)
        finally:
            admission.release(held)
        for path, body in requests:  # room again: answered, and the request's ticket handed back
            assert client.post(path, json=body).status_code == 200
        assert (admission.inputs, admission.tokens) == (0, 0)
    _all_equal(bodies)
    assert bodies[0]["type"] == "rate_limit_error" and bodies[0]["message"].startswith(
        "server is at capacity"
    )


def test_a_refusal_after_tokenizing_leaves_the_queue_empty(embed_server: TestClient) -> None:
    service = runtime_of(embed_server).service
    assert service is not None
    resp = embed_server.post("/v2/embed", json={"texts": ["t"], "output_dimension": 10**6})
    assert resp.status_code == 400
    assert (service.admission.inputs, service.admission.tokens) == (0, 0)


def test_the_replica_refuses_as_the_server_does(embed_server: TestClient) -> None:
    runtime = runtime_of(embed_server)
    requests = [embeddings(["a", "b", "c"]), cohere([words(60)]), rerank(["d"]), embeddings(["t"], model="m")]
    for path, body in requests:
        reply = asyncio.run(replica_answer(runtime, runtime.metrics, path, body, None))
        direct = embed_server.post(path, json=body)
        assert reply["status"] == direct.status_code and reply["body"] == direct.json()
