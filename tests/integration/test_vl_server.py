"""`embedserve serve` on a Qwen3-VL directory, as a real process: the openai client with content
items, and vLLM's `messages` body over plain HTTP (as curl sends it)."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.helpers.reference import cosine
from tests.helpers.server_process import start_server
from tests.helpers.tiny_vl import encoded, hf_vl_embed, image


def test_openai_client_and_messages_body(
    qwen3_vl_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    img = image(160, 96, seed=3)
    url = "data:image/png;base64," + base64.b64encode(encoded(img)).decode()
    content = [{"type": "text", "text": "a figure: "}, {"type": "image_url", "image_url": {"url": url}}]
    ref = hf_vl_embed(qwen3_vl_dir, ["a figure: ", img])
    server = start_server(
        qwen3_vl_dir,
        tmp_path_factory.mktemp("vl-server"),
        "--warmup-lengths",
        "16",
        "--max-images-per-input",
        "4",
    )
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
        resp = client.embeddings.create(
            model=_served(server.base_url),
            input=[{"content": content}],  # type: ignore[list-item]  # an extension item
            encoding_format="float",
        )
        got = np.array([resp.data[0].embedding], dtype=np.float32)
        assert cosine(got, ref[None])[0] >= 0.99999
        body = {"messages": [{"role": "user", "content": content}], "encoding_format": "float"}
        r = httpx.post(server.base_url + "/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert cosine(np.array([r.json()["data"][0]["embedding"]]), ref[None])[0] >= 0.99999
        remote = {
            "input": [{"content": [{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]}]
        }
        assert httpx.post(server.base_url + "/v1/embeddings", json=remote, timeout=60).status_code == 400
    finally:
        assert server.terminate() == 0, server.log()


def _served(base_url: str) -> str:
    return str(httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"])
