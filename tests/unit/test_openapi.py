"""`/openapi.json` tells the truth: what it allows is answered 200 and matches the response
schema; what it forbids is refused with a documented 4xx in the documented error shape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from tests.helpers.inprocess import gateway_app, server_client

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, max_inputs_per_request=8, max_queued_requests=8) as c:
        yield c


@pytest.fixture(scope="module")
def doc(client: TestClient) -> dict[str, Any]:
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    return resp.json()


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Validator:
    # Resolve "#/components/..." refs against the whole document.
    full = {**schema, "components": doc.get("components", {})}
    return jsonschema.Draft202012Validator(full)


def _request_schema(doc: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    return schema


def _response_schema(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    content = doc["paths"][path][method]["responses"][str(status)]["content"]
    schema: dict[str, Any] = content["application/json"]["schema"]
    return schema


def _readme_examples() -> list[dict[str, Any]]:
    """The README's request bodies: its curl `-d` JSON and its OpenAI-client calls."""
    text = README.read_text()
    bodies = [json.loads(m) for m in re.findall(r"-d '(\{.*?\})'", text)]
    assert bodies, "the README's curl example moved"
    return [
        *bodies,
        {"model": "MODEL", "input": ["a document", "another"]},
        {"model": "MODEL", "input": "what is RoPE?", "dimensions": 32, "truncate": "end"},
        {"input": [1, 2, 3]},
        {"input": [[1, 2, 3], [4, 5]], "encoding_format": "base64", "priority": "batch"},
        {"input": "x", "prompt_name": "query", "normalize": False, "user": "u1"},
    ]


def test_the_request_body_is_documented_with_every_field(doc: dict[str, Any]) -> None:
    schema = _request_schema(doc)
    assert schema["required"] == ["input"] and schema["additionalProperties"] is False
    fields = {"input", "model", "encoding_format", "dimensions", "user", "prompt_name", "prompt"}
    assert fields | {"normalize", "priority", "truncate", "embedding_type"} == set(schema["properties"])
    assert len(schema["properties"]["input"]["anyOf"]) == 4
    assert schema["properties"]["input"]["anyOf"][1]["maxItems"] == 8  # the server's setting


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
