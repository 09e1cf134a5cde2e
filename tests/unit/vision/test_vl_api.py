"""`/v1/embeddings` with images: data-URI parts, content items, vLLM's `messages` body, bad
images (400 / 413) that leave the server serving, token counts; text-only models refuse images;
the gateway counts image tokens from the image size."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from embedserve.engine.options import EngineOptions
from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import encoded, hf_vl_embed, image

IMG = image(128, 96, seed=1)


def data_uri(img: Image.Image, fmt: str = "PNG") -> str:
    mime = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(encoded(img, fmt)).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def client(qwen3_vl_dir: Path) -> Any:
    with server_client(
        qwen3_vl_dir,
        engine=EngineOptions(max_image_pixels=200_000, max_images_per_input=3, max_num_batched_tokens=128),
    ) as c:
        yield c


def test_parts_content_items_and_messages(client: Any, qwen3_vl_dir: Path) -> None:
    content = [
        {"type": "text", "text": "a chart: "},
        image_part(data_uri(IMG)),
        {"type": "text", "text": " end"},
    ]
    body = {"input": ["plain text", {"content": content}, image_part(data_uri(IMG, "JPEG"))]}
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    ref = np.stack(
        [
            hf_vl_embed(qwen3_vl_dir, ["plain text"]),
            hf_vl_embed(qwen3_vl_dir, ["a chart: ", IMG, " end"]),
            hf_vl_embed(qwen3_vl_dir, [Image.open(io.BytesIO(encoded(IMG, "JPEG"))).convert("RGB")]),
        ]
    )
    got = np.array([d["embedding"] for d in data], dtype=np.float32)
    assert cosine(got, ref).min() >= 0.99999
    assert data[1]["num_tokens"] > data[0]["num_tokens"] + 12  # 12 image tokens (128 x 96)
    assert r.json()["usage"]["prompt_tokens"] == sum(d["num_tokens"] for d in data)
    messages = {
        "messages": [
            {"role": "system", "content": "Represent the user's input."},
            {"role": "user", "content": content},
        ]
    }
    r2 = client.post("/v1/embeddings", json=messages)
    assert r2.status_code == 200, r2.text
    assert cosine(np.array([r2.json()["data"][0]["embedding"]]), got[1:2])[0] >= 0.99999


@pytest.mark.parametrize(
    ("part", "status", "words"),
    [
        (image_part("https://example.com/cat.png"), 400, "remote image URLs are not fetched"),
        (image_part("data:image/gif;base64,R0lGODlhAQABAAAAACw="), 400, "unsupported image type"),
        (image_part("data:image/png;base64,%%%not-base64"), 400, "not valid base64"),
        (
            image_part("data:image/png;base64," + base64.b64encode(b"garbage bytes").decode()),
            400,
            "cannot be decoded",
        ),
        (image_part(data_uri(image(600, 400, seed=2))), 413, "exceeds the limit of 200000 pixels"),
        ({"content": [image_part(data_uri(IMG))] * 4}, 400, "4 images in one input exceed the limit of 3"),
        ({"type": "image_url"}, 422, "a part must be"),
    ],
)
def test_bad_images_answer_clearly_and_the_server_keeps_serving(
    client: Any, part: dict[str, Any], status: int, words: str
) -> None:
    r = client.post("/v1/embeddings", json={"input": ["fine text", part]})
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    ok = client.post("/v1/embeddings", json={"input": [{"content": [image_part(data_uri(IMG))]}]})
    assert ok.status_code == 200


def test_text_only_model_refuses_images_with_400(qwen3_dir: Path) -> None:
    with server_client(qwen3_dir) as c:
        r = c.post("/v1/embeddings", json={"input": [image_part(data_uri(IMG))]})
        assert r.status_code == 400 and f"model {qwen3_dir.name} takes text only" in r.text
        ok = c.post("/v1/embeddings", json={"input": [{"content": [{"type": "text", "text": "just text"}]}]})
        assert ok.status_code == 200


def test_gateway_counts_image_tokens_from_the_size(client: Any, qwen3_vl_dir: Path) -> None:
    from fastapi.testclient import TestClient

    from embedserve.api.protocol import EmbeddingRequest
    from embedserve.gateway.pools.counting import TokenCounter

    sizes = [(64, 64), (300, 200), (500, 90)]
    items = [
        {"content": [{"type": "text", "text": "x"}, image_part(data_uri(image(w, h, seed=w)))]}
        for w, h in sizes
    ]
    body = {"input": items}
    direct = client.post("/v1/embeddings", json=body)
    assert direct.status_code == 200, direct.text
    served = [d["num_tokens"] for d in direct.json()["data"]]
    counted = TokenCounter(qwen3_vl_dir).count(EmbeddingRequest.model_validate(body).items, "")
    assert counted == served  # from each image's header, no pixel decoded
    with TestClient(gateway_app(client.app, qwen3_vl_dir)) as g:
        r = g.post("/v1/embeddings", json=body)  # placed by those counts in the short / long pools
    assert r.status_code == 200, r.text
    assert [d["num_tokens"] for d in r.json()["data"]] == served


def test_tokenize_counts_image_tokens_as_embeddings_bills_them(client: Any, qwen3_vl_dir: Path) -> None:
    from fastapi.testclient import TestClient

    items: list[Any] = [
        "plain text",
        {
            "content": [
                {"type": "text", "text": "a chart: "},
                image_part(data_uri(IMG)),
                {"type": "text", "text": "x"},
            ]
        },
        image_part(data_uri(image(300, 200, seed=3))),
    ]
    billed = client.post("/v1/embeddings", json={"input": items})
    assert billed.status_code == 200, billed.text
    served = [d["num_tokens"] for d in billed.json()["data"]]
    with TestClient(gateway_app(client.app, qwen3_vl_dir)) as g:
        for item, n in zip(items, served, strict=True):
            for c in (client, g):
                r = c.post("/tokenize", json={"input": item})
                assert r.status_code == 200, r.text
                assert r.json()["count"] == n == len(r.json()["tokens"])
    parts = client.post("/tokenize", json={"input": items[1]["content"]})  # the parts as a list
    assert parts.json()["count"] == served[1]
    assert client.post("/tokenize", json={"input": items[1], "add_special_tokens": False}).status_code == 400
