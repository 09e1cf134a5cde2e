"""The new architectures through the server and the gateway, as the other models are: OpenAI's
and Cohere's and TEI's routes, prompts by name and by input_type, exact token counts through the
gateway, Matryoshka dimensions after Dense modules, bf16 and deterministic engines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from embedserve import Engine
from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.tiny_gemma import build_gemma3

TEXTS = ["the wing's lift was measured", "slipstream " * 40, "angles of attack"]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gemma3(tmp_path_factory.mktemp("gemma_srv") / "g")


def test_gemma3_served_and_through_the_gateway(gemma_dir: Path) -> None:
    with Engine.from_pretrained(gemma_dir) as engine:
        query = engine.embed(TEXTS, prompt_name="query")
        classification = engine.embed(TEXTS, prompt_name="Classification")
        short = engine.embed(TEXTS, prompt_name="document", dimensions=32)
        counts = [
            len(t.token_ids) for t in engine.renderer.text(TEXTS, engine.renderer.prompt("query", None))
        ]
    with server_client(gemma_dir) as server:
        gateway = TestClient(gateway_app(server.app, gemma_dir))
        for client in (server, gateway):
            r = client.post("/v1/embeddings", json={"input": TEXTS, "prompt_name": "query"})
            assert r.status_code == 200, r.text
            body = r.json()
            np.testing.assert_allclose([d["embedding"] for d in body["data"]], query, atol=1e-6)
            assert body["usage"]["prompt_tokens"] == sum(counts)  # the gateway counts exactly
            r = client.post(
                "/v1/embeddings", json={"input": TEXTS, "prompt_name": "document", "dimensions": 32}
            )
            np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], short, atol=1e-6)
            r = client.post("/v2/embed", json={"texts": TEXTS, "input_type": "search_query"})
            np.testing.assert_allclose(r.json()["embeddings"]["float"], query, atol=1e-6)
            r = client.post("/v2/embed", json={"texts": TEXTS, "input_type": "classification"})
            np.testing.assert_allclose(r.json()["embeddings"]["float"], classification, atol=1e-6)
            r = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "query"})
            np.testing.assert_allclose(r.json(), query, atol=1e-6)
        card = server.get("/v1/models").json()["data"][0]
        assert card["dimensions"] == 96
        r = server.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 97})
        assert r.status_code == 400 and "[1, 96]" in r.text


@pytest.mark.parametrize("options", [{"dtype": "bfloat16"}, {"deterministic": True}])
def test_gemma3_bf16_and_deterministic(gemma_dir: Path, options: dict[str, object]) -> None:
    with Engine.from_pretrained(gemma_dir) as engine:
        want = engine.embed(TEXTS)
    with Engine.from_pretrained(gemma_dir, **options) as engine:
        got = engine.embed(TEXTS)
        again = engine.embed(TEXTS[::-1])[::-1]
    cos = np.sum(got * want, axis=1)
    assert cos.min() >= (0.99 if options.get("dtype") else 0.99999)
    if options.get("deterministic"):
        assert np.array_equal(got, again)  # another batch order, the same bits


def test_a_head_narrower_than_the_model_and_long_late_chunking_refused(tmp_path: Path) -> None:
    """Dense 96 -> 64 (bias, Tanh): the card, the dimensions limit and the vectors follow the head;
    a document over one window is refused through the server too (its windows' rows would pass
    the head before being joined)."""
    from embedserve.engine.options import EngineOptions
    from tests.helpers.reference import cosine, st_embed

    d = build_gemma3(
        tmp_path / "g64", dense=(64,), dense_bias=True, activation="torch.nn.modules.activation.Tanh"
    )
    with server_client(d, engine=EngineOptions(max_model_len=64)) as server:
        assert server.get("/v1/models").json()["data"][0]["dimensions"] == 64
        r = server.post("/v1/embeddings", json={"input": TEXTS[:1] + TEXTS[2:]})
        assert (
            cosine(
                np.array([e["embedding"] for e in r.json()["data"]]), st_embed(d, TEXTS[:1] + TEXTS[2:])
            ).min()
            > 0.99999
        )
        assert "[1, 64]" in server.post("/v1/embeddings", json={"input": "x", "dimensions": 80}).text
        late = {"input": " ".join(["word"] * 200), "late_chunking": True, "late_chunk_size": 20}
        r = server.post("/v1/embeddings", json={**late, "long_late_chunking": True})
        assert r.status_code == 400 and "Dense modules after pooling" in r.text
