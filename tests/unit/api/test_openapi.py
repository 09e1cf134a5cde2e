"""`/openapi.json` tells the truth: what it allows is answered 200 and matches the response
schema; what it forbids is refused with a documented 4xx in the documented error shape."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.openapi.utils import get_openapi
from fastapi.testclient import TestClient

from embedserve.engine.options import EngineOptions
from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.tiny_rerankers import build_cross_encoder
from tests.helpers.tiny_vl import encoded, image

README = Path(__file__).resolve().parents[3] / "README.md"


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, max_inputs_per_request=8, max_queued_requests=8) as c:
        yield c


@pytest.fixture(scope="module")
def doc(client: TestClient) -> dict[str, Any]:
    """The served model's document (an embedding model's routes: api/openapi_contract.py)."""
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    return resp.json()


@pytest.fixture(scope="module")
def generic(client: TestClient) -> dict[str, Any]:
    """The document of every route and shape, as the app serves it before its model loads."""
    app: Any = client.app
    return get_openapi(title=app.title, version=app.version, routes=app.routes)


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Validator:
    # Resolve "#/components/..." refs against the whole document.
    full = {**schema, "components": doc.get("components", {})}
    return jsonschema.Draft202012Validator(full)


def _request_schema(doc: dict[str, Any], path: str = "/v1/embeddings") -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    return schema


def _response_schema(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    content = doc["paths"][path][method]["responses"][str(status)]["content"]
    schema: dict[str, Any] = content["application/json"]["schema"]
    return schema


def _readme_curls() -> list[tuple[str, dict[str, Any]]]:
    """The README's one-line curl examples: (path, JSON body)."""
    found = re.findall(r"curl -s (?:\$S|http://[^/\s]+)(/[\w/]+) [^\n]*?-d '(\{.*?\})'", README.read_text())
    assert found, "the README's curl examples moved"
    return [(path, json.loads(body)) for path, body in found]


def _readme_examples() -> list[dict[str, Any]]:
    """The README's `/v1/embeddings` request bodies: its curl `-d` JSON and its OpenAI-client calls."""
    bodies = [body for path, body in _readme_curls() if path == "/v1/embeddings"]
    assert bodies, "the README's curl example moved"
    return [
        *bodies,
        {"model": "MODEL", "input": ["a document", "another"]},
        {"model": "MODEL", "input": "what is RoPE?", "dimensions": 32, "truncate": "end"},
        {"input": [1, 2, 3]},
        {"input": [[1, 2, 3], [4, 5]], "encoding_format": "base64", "priority": "batch"},
        {"input": "x", "prompt_name": "query", "normalize": False, "user": "u1"},
    ]


def test_every_readme_curl_example_is_documented_and_answered(
    client: TestClient, doc: dict[str, Any], generic: dict[str, Any]
) -> None:
    """Each body validates against its route's request schema; an embedding model documents and
    answers its own routes' bodies 200, and answers (without documenting) a reranker's or a
    classifier's with a 400 naming its own route."""
    from embedserve.api.routes import route_at

    paths = {path for path, _ in _readme_curls()}
    assert {"/v2/embed", "/v1/score", "/tokenize", "/detokenize", "/embed", "/rerank", "/classify"} <= paths
    for path, body in _readme_curls():
        route = route_at(path)
        assert route is not None, path
        assert _validator(generic, _request_schema(generic, path)).is_valid(body), (path, body)
        resp = client.post(path, json=body)
        if "embed" in route.tasks:
            assert _validator(doc, _request_schema(doc, path)).is_valid(body), (path, body)
            assert resp.status_code == 200, (path, resp.text)
            _validator(doc, _response_schema(doc, path, "post", 200)).validate(resp.json())
        else:
            assert resp.status_code == 400 and "is an embedding model" in resp.text, (path, resp.text)
            assert path not in doc["paths"]


def test_the_request_body_is_documented_with_every_field(doc: dict[str, Any]) -> None:
    schema = _request_schema(doc)
    assert schema["oneOf"] == [{"required": ["input"]}, {"required": ["messages"]}]
    assert schema["additionalProperties"] is False
    fields = {"input", "model", "encoding_format", "dimensions", "user", "prompt_name", "prompt", "messages"}
    extensions = {"normalize", "priority", "truncate", "embedding_type", "sparse_top_k", "return_tokens"}
    extensions |= {"late_chunking", "chunk_spans", "late_chunk_size", "span_pooling", "long_late_chunking"}
    extensions |= {"late_overlap", "input_type", "multivector_dtype"}
    assert fields | extensions == set(schema["properties"])
    assert len(schema["properties"]["input"]["anyOf"]) == 6  # OpenAI's four, an image / content item, a list
    assert schema["properties"]["input"]["anyOf"][1]["maxItems"] == 8  # the server's setting
    assert schema["properties"]["input"]["anyOf"][5]["maxItems"] == 8


def test_every_error_status_is_documented_with_its_body(doc: dict[str, Any]) -> None:
    responses = doc["paths"]["/v1/embeddings"]["post"]["responses"]
    assert {"200", "400", "404", "408", "413", "422", "429", "500", "503"} <= set(responses)
    for status in ("429", "503"):
        assert "Retry-After" in responses[status]["headers"]
    assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    assert set(doc["paths"]["/health/ready"]["get"]["responses"]) == {"200", "503"}


def test_readme_examples_validate_and_are_answered_as_documented(
    client: TestClient, doc: dict[str, Any]
) -> None:
    request_ok = _validator(doc, _request_schema(doc))
    response_ok = _validator(doc, _response_schema(doc, "/v1/embeddings", "post", 200))
    model = client.get("/v1/models").json()["data"][0]["id"]
    for body in _readme_examples():
        body = {**body, "model": model} if "model" in body else body
        request_ok.validate(body)
        resp = client.post("/v1/embeddings", json=body)
        assert resp.status_code == 200, (body, resp.text)
        response_ok.validate(resp.json())
    models_ok = _validator(doc, _response_schema(doc, "/v1/models", "get", 200))
    models_ok.validate(client.get("/v1/models").json())


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"input": "x", "dimension": 3}, 422),  # a typo of dimensions
        ({"input": 5}, 422),
        ({"input": [1, "a"]}, 422),
        ({"input": "x", "encoding_format": "int8"}, 422),
        ({"input": "x", "dimensions": 0}, 422),
        ({"input": "x", "dimensions": 1.5}, 422),
        ({"input": []}, 400),
        ({"input": ""}, 400),
        ({"input": [[]]}, 400),
        ({"input": [-1]}, 400),
        ({"input": ["a"] * 9}, 400),
        ({}, 422),
    ],
)
def test_what_the_schema_forbids_is_refused(
    client: TestClient, doc: dict[str, Any], body: dict[str, Any], status: int
) -> None:
    assert not _validator(doc, _request_schema(doc)).is_valid(body)
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == status, resp.text
    assert str(status) in doc["paths"]["/v1/embeddings"]["post"]["responses"]
    _validator(doc, _response_schema(doc, "/v1/embeddings", "post", status)).validate(resp.json())


PNG = "data:image/png;base64," + base64.b64encode(encoded(image(64, 48, seed=1))).decode()
IMAGE = {"type": "image_url", "image_url": {"url": PNG}}
TEXT = {"type": "text", "text": "a chart: "}


def test_a_text_only_models_document_has_no_image_and_it_answers_one_with_400(
    client: TestClient, doc: dict[str, Any], generic: dict[str, Any]
) -> None:
    body = {"input": [{"content": [TEXT, IMAGE]}]}
    assert _validator(generic, _request_schema(generic)).is_valid(body)  # a multimodal model's shape
    assert not _validator(doc, _request_schema(doc)).is_valid(body)  # not this model's
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == 400 and "takes text only" in resp.json()["error"]["message"]
    assert "text-only model" in doc["paths"]["/v1/embeddings"]["post"]["responses"]["400"]["description"]


def test_metrics_are_served_as_prometheus_text(client: TestClient) -> None:
    resp = client.get("/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    assert "embedserve_requests_total" in resp.text


def test_the_gateway_documents_the_same_api(client: TestClient, qwen3_dir: Path) -> None:
    gateway = TestClient(gateway_app(client.app, qwen3_dir, max_inputs_per_request=4))
    doc = gateway.get("/openapi.json").json()
    schema = _request_schema(doc)
    assert schema["properties"]["input"]["anyOf"][1]["maxItems"] == 4
    responses = doc["paths"]["/v1/embeddings"]["post"]["responses"]
    assert {"200", "400", "413", "422", "429", "502", "503", "504"} <= set(responses)
    assert "Retry-After" in responses["429"]["headers"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    response_ok = _validator(doc, _response_schema(doc, "/v1/embeddings", "post", 200))
    resp = gateway.post("/v1/embeddings", json={"input": ["short text", "word " * 100]})
    assert resp.status_code == 200, resp.text
    response_ok.validate(resp.json())
    assert [d["pool"] for d in resp.json()["data"]] == ["short", "long"]
    refused = gateway.post("/v1/embeddings", json={"input": "x", "dimension": 3})
    assert refused.status_code == 422


OTHER_ROUTES = {
    "/v2/embed": (
        {"texts"},
        {"texts", "model", "input_type", "embedding_types", "output_dimension", "truncate"},
    ),
    "/v1/rerank": (
        {"query", "documents"},
        {"query", "documents", "model", "top_n", "return_documents", "raw_scores", "truncate"}
        | {"instruction", "priority"},
    ),
}


@pytest.mark.parametrize("path", ["/v2/embed", "/v1/rerank", "/rerank", "/v2/rerank"])
def test_the_other_routes_document_their_bodies(generic: dict[str, Any], path: str) -> None:
    doc = generic
    required, fields = OTHER_ROUTES["/v2/embed" if path == "/v2/embed" else "/v1/rerank"]
    schema = _request_schema(doc, path)
    if path != "/v2/embed":  # Cohere's body, or TEI's
        cohere, tei = schema["anyOf"]
        assert set(tei["required"]) == {"query", "texts"} and tei["properties"]["texts"]["maxItems"] == 8
        schema = cohere
    assert set(schema["required"]) == required and set(schema["properties"]) == fields
    assert schema["additionalProperties"] is False and "$defs" not in json.dumps(schema)
    limited = "texts" if path == "/v2/embed" else "documents"
    assert schema["properties"][limited]["maxItems"] == 8  # the server's setting
    responses = doc["paths"][path]["post"]["responses"]
    assert {"200", "400", "413", "422", "429", "503"} <= set(responses)
    assert "X-Request-Timeout" in doc["paths"][path]["post"]["description"]
    assert "deadline_exceeded" in responses["503"]["description"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"texts": ["a document", "another"]}, 200),
        ({"texts": ["q"], "input_type": "search_query", "embedding_types": ["float", "int8", "base64"]}, 200),
        ({"texts": ["q"], "output_dimension": 32, "truncate": "START"}, 200),
        ({"texts": []}, 422),
        ({"texts": ["q"], "input_type": "query"}, 422),
        ({"texts": ["q"], "embedding_types": ["int4"]}, 422),
        ({"texts": ["q"], "extra": 1}, 422),
        ({"texts": ["q"] * 9}, 400),
        ({"texts": "q"}, 422),
    ],
)
def test_cohere_embed_is_answered_as_documented(
    client: TestClient, doc: dict[str, Any], body: dict[str, Any], status: int
) -> None:
    assert _validator(doc, _request_schema(doc, "/v2/embed")).is_valid(body) == (status == 200)
    resp = client.post("/v2/embed", json=body)
    assert resp.status_code == status, resp.text
    _validator(doc, _response_schema(doc, "/v2/embed", "post", status)).validate(resp.json())


@pytest.fixture(scope="module")
def rerank_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    ce = build_cross_encoder(tmp_path_factory.mktemp("ce") / "bert-ce", "bert")
    engine = {"max_model_len": 128, "max_num_batched_tokens": 512}
    with server_client(ce, engine=EngineOptions(**engine), max_inputs_per_request=4) as c:
        yield c


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"query": "lift", "documents": ["wings", {"text": "airfoils"}]}, 200),
        ({"query": "lift", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": True}, 200),
        ({"query": "lift", "documents": ["a"], "raw_scores": True, "truncate": "start"}, 200),
        ({"query": "lift", "documents": []}, 422),
        ({"query": "lift", "documents": [{"txt": "a"}]}, 422),
        ({"query": "lift", "documents": ["a"], "top_n": 0}, 422),
        ({"documents": ["a"]}, 422),
        ({"query": "lift", "documents": ["a"] * 5}, 400),
    ],
)
def test_rerank_is_answered_as_documented(
    rerank_client: TestClient, body: dict[str, Any], status: int
) -> None:
    doc = rerank_client.get("/openapi.json").json()
    assert _validator(doc, _request_schema(doc, "/v1/rerank")).is_valid(body) == (status == 200)
    resp = rerank_client.post("/v1/rerank", json=body)
    assert resp.status_code == status, resp.text
    _validator(doc, _response_schema(doc, "/v1/rerank", "post", status)).validate(resp.json())


def test_the_gateway_documents_the_other_routes(client: TestClient, qwen3_dir: Path) -> None:
    gateway = TestClient(gateway_app(client.app, qwen3_dir, max_inputs_per_request=4))
    doc = gateway.get("/openapi.json").json()
    for path, limited, most in (("/v2/embed", "texts", 4), ("/v1/score", "text_2", 3)):  # text_1 counts too
        shapes = _request_schema(doc, path)["properties"][limited]
        assert next(s for s in shapes.get("anyOf", [shapes]) if s.get("type") == "array")["maxItems"] == most
        assert {"502", "503", "504"} <= set(doc["paths"][path]["post"]["responses"])
    assert "/v1/rerank" not in doc["paths"]  # its pools serve an embedding model
    body = {"texts": ["short text", "word " * 100], "embedding_types": ["float"]}
    assert _validator(doc, _request_schema(doc, "/v2/embed")).is_valid(body)
    resp = gateway.post("/v2/embed", json=body)
    assert resp.status_code == 200, resp.text
    _validator(doc, _response_schema(doc, "/v2/embed", "post", 200)).validate(resp.json())
    assert not _validator(doc, _request_schema(doc, "/v2/embed")).is_valid({"texts": ["x"] * 5})
    assert gateway.post("/v2/embed", json={"texts": ["x"] * 5}).status_code == 400
