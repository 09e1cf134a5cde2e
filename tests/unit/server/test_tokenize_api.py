"""`POST /tokenize` and `/detokenize` (vLLM's and TEI's shapes) on a real server over a tiny
Qwen3 model, and through a gateway: the count is what `/v1/embeddings` bills for the same input
(prompt, special tokens), ids round-trip, bad bodies are clear 4xx."""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from tests.helpers.inprocess import gateway_app, server_client

WORDS = [
    "the",
    "a",
    "lift",
    "wing",
    "air",
    "flow",
    "boundary",
    "layer",
    "shock",
    "wave",
    "Mach",
    "0.8",
    "über",
    "naïve",
    "東京",
    "😀",
    ",",
    ".",
    "!",
    "?",
]


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


IMAGE = {"type": "image_url", "image_url": {"url": _png()}}


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 60))]
        texts.append(" ".join(words) if rng.random() < 0.8 else "".join(words))
    return texts


@pytest.fixture(scope="module")
def client(qwen3_dir: Path) -> Iterator[TestClient]:
    with server_client(qwen3_dir, max_inputs_per_request=256) as c:
        yield c


@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_count_is_what_embeddings_bills_for_200_random_texts(
    client: TestClient, prompt_name: str | None
) -> None:
    texts = _random_texts(200, seed=1 if prompt_name else 0)
    extra = {} if prompt_name is None else {"prompt_name": prompt_name}
    emb = client.post("/v1/embeddings", json={"input": texts, **extra})
    assert emb.status_code == 200, emb.text
    billed = [d["num_tokens"] for d in emb.json()["data"]]
    counts = []
    for text in texts:
        resp = client.post("/tokenize", json={"prompt": text, **extra})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
        counts.append(body["count"])
    assert counts == billed
    assert sum(counts) == emb.json()["usage"]["prompt_tokens"]
    # TEI's shape on the same path: every input at once, the same ids.
    tei = client.post("/tokenize", json={"inputs": texts[:20], **extra}).json()
    assert [len(t) for t in tei] == counts[:20]


def test_one_text_alone_equals_its_embeddings_usage(client: TestClient) -> None:
    text = "Instruct: find passages\nQuery: how do wings make lift?"
    usage = client.post("/v1/embeddings", json={"input": text}).json()["usage"]["prompt_tokens"]
    assert client.post("/tokenize", json={"input": text}).json()["count"] == usage


def test_detokenize_round_trips_without_special_tokens(client: TestClient) -> None:
    for text in _random_texts(30, seed=3):
        body = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
        back = client.post("/detokenize", json={"tokens": body["tokens"]})
        assert back.status_code == 200 and back.json() == {"prompt": text}
        with_specials = client.post("/tokenize", json={"prompt": text}).json()["tokens"]
        assert len(with_specials) == len(body["tokens"]) + 1  # the appended EOS


def test_offsets_and_teis_tokens_point_into_the_text(client: TestClient) -> None:
    text = "wing lift über 東京"
    body = client.post("/tokenize", json={"prompt": text, "return_offsets": True}).json()
    assert len(body["offsets"]) == body["count"]
    tei = client.post("/tokenize", json={"inputs": text}).json()
    (tokens,) = tei
    assert [t["id"] for t in tokens] == body["tokens"]
    assert [[t["start"], t["stop"]] for t in tokens] == body["offsets"]
    assert tokens[-1]["special"] and not any(t["special"] for t in tokens[:-1])
    assert all(text[t["start"] : t["stop"]] == t["text"] for t in tokens)
    # A character cut across byte-level tokens is spanned by each of them; ASCII spans tile it.
    ascii_text = "wing lift, over the air."
    (tokens,) = client.post("/tokenize", json={"inputs": [ascii_text]}).json()
    assert "".join(t["text"] for t in tokens if not t["special"]) == ascii_text


def test_an_input_over_max_model_len_is_counted_whole_unless_cut(client: TestClient) -> None:
    limit = client.get("/v1/models").json()["data"][0]["max_model_len"]
    text = "wing " * (limit + 10)
    whole = client.post("/tokenize", json={"prompt": text}).json()
    assert whole["count"] > limit == whole["max_model_len"]
    cut = client.post("/tokenize", json={"prompt": text, "truncate": "end"}).json()
    emb = client.post("/v1/embeddings", json={"input": text, "truncate": "end"}).json()
    assert cut["count"] == limit == emb["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/tokenize", {}, 422, "exactly one of `prompt` or `input`"),
        ("/tokenize", {"prompt": "a", "inputs": "b"}, 422, "prompt and inputs"),
        ("/tokenize", {"input": ["a", "b"]}, 422, "one input per request"),
        ("/tokenize", {"prompt": ""}, 400, "empty string"),
        ("/tokenize", {"prompt": "a", "prompt_name": "nope"}, 400, "unknown prompt name"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "not found"),
        ("/tokenize", {"prompt": "a", "truncate": "error"}, 422, "truncate"),
        (
            "/tokenize",
            {"input": [IMAGE]},
            400,
            "takes text only",
        ),
        ("/detokenize", {"tokens": []}, 422, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, 400, "outside the vocabulary"),
        ("/detokenize", {"tokens": "abc"}, 422, "tokens"),
    ],
)
def test_bad_bodies_are_clear_4xx(
    client: TestClient, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    resp = client.post(path, json=body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]


def test_an_image_refusal_names_the_served_model(qwen3_dir: Path) -> None:
    image = IMAGE
    with server_client(qwen3_dir, served_model_name="my-embedder") as c:
        for path, body in (("/tokenize", {"input": [image]}), ("/v1/embeddings", {"input": [image]})):
            message = c.post(path, json=body).json()["error"]["message"]
            assert "model my-embedder takes text only" in message, message


def test_through_the_gateway(client: TestClient, qwen3_dir: Path) -> None:
    gateway = TestClient(gateway_app(client.app, qwen3_dir))
    texts = _random_texts(10, seed=5)
    for text in texts:
        direct = client.post("/tokenize", json={"prompt": text}).json()
        assert gateway.post("/tokenize", json={"prompt": text}).json() == direct
    long = "wing " * 100  # past the short pool: placed on the long one
    resp = gateway.post("/tokenize", json={"inputs": [texts[0], long]})
    assert resp.status_code == 200 and resp.headers["x-embedserve-pools"] == "long"
    assert (
        gateway.post("/detokenize", json={"tokens": [5, 6]}).json()
        == client.post("/detokenize", json={"tokens": [5, 6]}).json()
    )
    assert gateway.post("/tokenize", json={"prompt": "a", "model": "other"}).status_code == 404
    named = TestClient(gateway_app(client.app, qwen3_dir, served_model_name="my-embedder"))
    refused = named.post("/v1/embeddings", json={"input": [IMAGE]})
    assert refused.status_code == 400 and "model my-embedder takes text only" in refused.text
