"""What `/v2/embed` and `/v1/rerank` must answer through a gateway (HTTP pools or the Ray Serve
ingress) whose pools are one server: the server's own answers, and the gateway's refusals.
Shared by tests/unit/gateway/test_gateway_routes.py and test_scale_ingress_routes.py."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from tests.helpers.server_process import words

QUERY = "how do wings produce lift"
DOCS = ["pressure difference over an airfoil", "boundary layers", "lift", "shock waves in nozzles"]
RERANK_BODY: dict[str, Any] = {
    "query": QUERY,
    "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]],
    "top_n": 3,
    "return_documents": True,
}

# (body, status, part of the message) for a gateway with max_inputs_per_request=4 whose pools
# are a tiny Qwen3 of 512 tokens at most, the short one of 64.
COHERE_REFUSALS: list[tuple[dict[str, Any], int, str]] = [
    ({"texts": []}, 422, "texts"),
    ({"texts": ["x"], "input_type": "nope"}, 422, "input_type"),
    ({"texts": ["x"] * 5}, 400, "5 inputs in one request; the limit is 4"),
    (  # the hint names Cohere's own values
        {"texts": [words(5000)], "truncate": "NONE"},
        400,
        "limit of 512 tokens; shorten the input or pass truncate 'END' / 'START'",
    ),
    ({"texts": ["x"], "model": "other"}, 404, "this gateway serves"),
    ({"texts": ["x"], "output_dimension": 10**6}, 400, "pool 'short'"),  # found by the pool
]


def assert_same_cohere(got: dict[str, Any], direct: dict[str, Any], kinds: list[str]) -> None:
    """A /v2/embed answer through the gateway equals the server's own (vectors by type)."""
    assert got["response_type"] == "embeddings_by_type" and got["texts"] == direct["texts"]
    assert got["embedding_schemas"] == direct["embedding_schemas"]
    for kind in kinds:
        assert np.allclose(
            got["embeddings"][kind], direct["embeddings"][kind], atol=1e-5 if kind == "float" else 1
        )


def assert_same_ranking(got: dict[str, Any], direct: dict[str, Any]) -> None:
    """A /v1/rerank answer through the gateway equals the server's own."""
    assert [r["index"] for r in got["results"]] == [r["index"] for r in direct["results"]]
    assert [r.get("document") for r in got["results"]] == [r.get("document") for r in direct["results"]]
    assert np.allclose(
        [r["relevance_score"] for r in got["results"]],
        [r["relevance_score"] for r in direct["results"]],
        atol=1e-5,
    )
    assert got["usage"] == direct["usage"] and got["embedding_schema"] == direct["embedding_schema"]


def assert_rerank_refusals(gateway: TestClient) -> None:
    """A gateway over a cross-encoder of 128 tokens refuses as the server would."""
    empty = gateway.post("/v1/rerank", json={"query": QUERY, "documents": ["ok", ""]})
    assert empty.status_code == 400 and "document 1" in empty.json()["error"]["message"]
    too_long = gateway.post(
        "/v1/rerank", json={"query": QUERY, "documents": [words(200)], "truncate": "error"}
    )
    assert too_long.status_code == 400 and "exceed the limit of 128" in too_long.json()["error"]["message"]
    shape = gateway.post("/v1/rerank", json={"query": QUERY, "documents": "not a list"})
    assert shape.status_code == 422
