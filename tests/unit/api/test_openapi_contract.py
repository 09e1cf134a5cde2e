"""`/openapi.json` as the served model's contract (api/openapi_contract.py): the routes of its task
and outputs, its prompt names, vocabulary and width; the numbers JSON Schema calls integers
(5.0) read as integers. tests/unit/server/test_fuzz_api.py holds the document to every schemathesis check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.openapi.utils import get_openapi
from fastapi.testclient import TestClient

from embedserve.api.openapi_contract import ModelFacts, served_document, served_openapi
from embedserve.batch.settings import BatchSettings
from tests.helpers.inprocess import server_client

EMBED_ONLY = ["/v1/embeddings", "/embed", "/similarity", "/embed_all", "/pooling", "/v2/embed"]
RERANK_ONLY = ["/v1/rerank", "/rerank", "/v2/rerank", "/classify", "/predict"]


@pytest.fixture(scope="module")
def client(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    batch = BatchSettings(tmp_path_factory.mktemp("batch"))
    with server_client(qwen3_dir, max_inputs_per_request=8, batch=batch) as c:
        yield c


def _body(doc: dict[str, Any], path: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    return schema


def _find(node: Any, key: str, value: Any) -> list[dict[str, Any]]:
    """Every schema object under `node` whose `key` is `value`."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get(key) == value:
            found.append(node)
        for v in node.values():
            found += _find(v, key, value)
    elif isinstance(node, list):
        for v in node:
            found += _find(v, key, value)
    return found


def test_the_document_states_the_served_model(client: TestClient) -> None:
    card = client.get("/v1/models").json()["data"][0]
    doc = client.get("/openapi.json").json()
    assert all(p in doc["paths"] for p in EMBED_ONLY)
    assert not [p for p in [*RERANK_ONLY, "/embed_sparse"] if p in doc["paths"]]  # another task's, a SPLADE's
    body = _body(doc, "/v1/embeddings")
    assert (
        body["properties"]["prompt_name"]["anyOf"][0]["enum"] == card["prompt_names"] == ["document", "query"]
    )
    assert body["properties"]["dimensions"]["anyOf"][0]["maximum"] == card["dimensions"]
    kinds = body["properties"]["embedding_type"]["anyOf"]
    assert not {"sparse", "multivector"} & {v for k in kinds for v in k.get("enum", [])}
    ids = _find(doc, "title", "TokenId")
    assert ids and all(s["maximum"] == card["vocab_size"] - 1 for s in ids)
    assert not _find(doc, "title", "ImagePart")  # a text-only model
    root = {s.get("title") for s in _body(doc, "/")["anyOf"]}
    assert root == {"TeiEmbedRequest", "SimilarityRequest"}  # what POST / routes for an embedding model


def test_what_the_document_allows_is_answered(client: TestClient) -> None:
    """Bodies the narrowed document allows at its edges get a 200; one past each edge a 400."""
    card = client.get("/v1/models").json()["data"][0]
    last = card["vocab_size"] - 1
    ok = client.post("/v1/embeddings", json={"input": [[0, last]], "dimensions": card["dimensions"]})
    assert ok.status_code == 200, ok.text
    assert client.post("/v1/embeddings", json={"input": [[0, last + 1]]}).status_code == 400
    assert (
        client.post("/v1/embeddings", json={"input": "x", "dimensions": card["dimensions"] + 1}).status_code
        == 400
    )
    assert client.post("/embed", json={"inputs": "x", "prompt_name": "query"}).status_code == 200
    assert client.post("/embed", json={"inputs": "x", "prompt_name": "nope"}).status_code == 400
    assert client.post("/v1/rerank", json={"query": "q", "documents": ["d"]}).status_code == 400


def test_integral_numbers_are_integers(client: TestClient) -> None:
    """JSON Schema's integers include 5.0: the parser takes them as 5 (and 8.5 stays refused)."""
    as_ints = client.post("/v1/embeddings", json={"input": [1, 2, 3], "dimensions": 8}).json()
    as_floats = client.post("/v1/embeddings", json={"input": [1.0, 2, 3.0], "dimensions": 8.0})
    assert as_floats.status_code == 200, as_floats.text
    np.testing.assert_array_equal(as_floats.json()["data"][0]["embedding"], as_ints["data"][0]["embedding"])
    refused = client.post("/v1/embeddings", json={"input": "x", "dimensions": 8.5})
    assert refused.status_code == 422 and "dimensions" in refused.json()["error"]["message"]


def test_an_upload_with_an_unknown_field_is_refused_naming_it(client: TestClient) -> None:
    files = {"file": ("in.jsonl", b"{}\n"), "purpose": (None, "batch"), "purpos": (None, "x")}
    r = client.post("/v1/files", files=files)
    assert r.status_code == 400 and "purpos" in r.json()["error"]["message"]


def test_a_reranker_and_a_fleet_get_their_routes(client: TestClient) -> None:
    app = client.app
    generic = get_openapi(title="t", version="1", routes=app.routes)  # type: ignore[attr-defined]
    reranker = ModelFacts(frozenset({"rerank"}), frozenset({"dense"}), frozenset(), 1000, 64)
    doc = served_document(generic, reranker, 8)
    assert all(p in doc["paths"] for p in RERANK_ONLY) and "/v1/embeddings" not in doc["paths"]
    assert {s.get("title") for s in _body(doc, "/")["anyOf"]} == {"RerankRequest", "TeiRerankRequest"}
    assert _body(doc, "/v1/score")["properties"]["raw_scores"] != {"enum": [False]}  # a reranker's option
    embedder = ModelFacts(frozenset({"embed"}), frozenset({"dense"}), frozenset({"q"}), 500, 32)
    both = served_document(generic, ModelFacts.union([reranker, embedder]), 8)
    assert all(p in both["paths"] for p in [*RERANK_ONLY, *EMBED_ONLY])
    assert _find(both, "title", "TokenId")[0]["maximum"] == 999
    assert _body(generic, "/v1/embeddings")["properties"]["prompt_name"] != {"type": "null"}  # not changed


def test_the_generic_document_until_the_model_is_known() -> None:
    facts: list[ModelFacts | None] = [None]
    openapi = served_openapi(lambda: {"paths": {}}, lambda: facts[0], 4)
    assert openapi() == {"paths": {}}
    facts[0] = ModelFacts(frozenset({"embed"}), frozenset({"dense"}), frozenset(), 10, 4)
    first = openapi()
    assert openapi() is first  # made once per set of facts


def test_a_multi_vector_model_documents_maxsim_rerank(client: TestClient) -> None:
    app: Any = client.app
    generic = get_openapi(title="t", version="1", routes=app.routes)
    colbert = ModelFacts(frozenset({"embed"}), frozenset({"dense", "multivector"}), frozenset(), 100, 16)
    doc = served_document(generic, colbert, 8)
    assert (
        all(p in doc["paths"] for p in ["/v1/rerank", "/rerank", "/v2/rerank"])
        and "/classify" not in doc["paths"]
    )
    cohere = _body(doc, "/v1/rerank")["anyOf"][0]
    assert cohere["properties"]["instruction"] == {"type": "null"}  # MaxSim takes none
    assert "RerankRequest" in {s.get("title") for s in _body(doc, "/invocations")["anyOf"]}


def test_numbers_at_the_parsers_limits_are_4xx_never_5xx(client: TestClient) -> None:
    """Bodies refused as they are, whose re-read with integral numbers as integers meets Python's
    limits (an integer literal's digits, nesting depth): a 4xx naming the problem."""
    bodies = [b'{"input": "x", "model": 1.5, "dimensions": 1' + b"0" * n + b"}" for n in (4290, 5000)] + [
        b'{"input": "x", "model": 1.0, "user": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    ]
    for body in bodies:
        r = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 422) and r.json()["error"]["message"], r.text[:200]
