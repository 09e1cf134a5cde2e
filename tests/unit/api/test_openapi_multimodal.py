"""`/openapi.json` tells the truth about text + image bodies of `/v1/embeddings` on a Qwen3-VL
server: image / content items, the mixed list and `messages` it documents are answered 200, the
shapes it forbids are refused with a documented 4xx (test_openapi.py: the text-only server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.helpers.inprocess import server_client
from tests.unit.api.test_openapi import IMAGE, PNG, TEXT, _request_schema, _response_schema, _validator


@pytest.fixture(scope="module")
def vl_client(qwen3_vl_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_vl_dir, max_inputs_per_request=4) as c:
        yield c


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"input": [{"content": [TEXT, IMAGE, {"type": "text", "text": " end"}]}, "plain", IMAGE]}, 200),
        ({"input": IMAGE}, 200),
        ({"input": {"content": "text as a content item"}, "prompt": "Find the chart."}, 200),
        ({"input": [{"type": "image_url", "image_url": PNG}, TEXT]}, 200),
        (
            {
                "messages": [
                    {"role": "system", "content": "Find it."},
                    {"role": "user", "content": [TEXT, IMAGE]},
                ]
            },
            200,
        ),
        ({"messages": [{"role": "user", "content": "just text"}], "dimensions": 32}, 200),
        ({"input": [{"content": []}]}, 422),
        ({"input": [{"type": "image"}]}, 422),
        ({"input": [{"content": [IMAGE], "extra": 1}]}, 422),
        ({"input": [{"type": "text", "text": "x", "image_url": PNG}]}, 422),
        ({"input": [{"content": [TEXT]}, 5]}, 422),
        ({"input": "x", "messages": [{"role": "user", "content": "y"}]}, 422),
        ({"messages": [{"role": "assistant", "content": "x"}]}, 422),
        ({"messages": [{"role": "system", "content": [IMAGE]}, {"role": "user", "content": "x"}]}, 422),
        ({"messages": []}, 422),
        ({"input": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}, 400),
        ({"input": [IMAGE] * 5}, 400),
    ],
)
def test_multimodal_bodies_are_answered_as_documented(
    vl_client: TestClient, body: dict[str, Any], status: int
) -> None:
    doc = vl_client.get("/openapi.json").json()
    assert _validator(doc, _request_schema(doc)).is_valid(body) == (status == 200), body
    resp = vl_client.post("/v1/embeddings", json=body)
    assert resp.status_code == status, resp.text
    assert str(status) in doc["paths"]["/v1/embeddings"]["post"]["responses"]
    _validator(doc, _response_schema(doc, "/v1/embeddings", "post", status)).validate(resp.json())
