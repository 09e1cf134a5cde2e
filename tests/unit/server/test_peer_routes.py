"""The peers' remaining routes: TEI's `POST /` (by the model's kind, huggingface_hub's bodies),
`/similarity` and `/decode`; vLLM's `/invocations`, `/ping`, `/version`, `/health`; Infinity's
`/embeddings` and `/models`. On the server and through a gateway, each answer equal to the route
it stands for; huggingface_hub's InferenceClient given only the base URL, over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import gateway_app, server_client
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_rerankers import build_cross_encoder

SOURCE = "How do wings make lift?"
# MiniLM reads 256 tokens: the gateway's long pool takes what the short one (64) cannot
POOLS = {
    "short": {"max_tokens": 64, "upstreams": ["http://short:1"]},
    "long": {"max_tokens": 256, "upstreams": ["http://long:2"]},
}
SENTENCES = ["A wing deflects air downwards.", "Tea is brewed with hot water.", "lift " * 70]


@pytest.fixture(scope="module")
def server() -> Iterator[TestClient]:
    with server_client(minilm_dir()) as c:
        yield c


@pytest.fixture(scope="module")
def gateway(server: TestClient) -> TestClient:
    return TestClient(gateway_app(server.app, minilm_dir(), pools=POOLS))


def _vectors(client: TestClient, texts: list[str], **extra: Any) -> np.ndarray:
    resp = client.post("/v1/embeddings", json={"input": texts, **extra})
    assert resp.status_code == 200, resp.text
    return np.array([d["embedding"] for d in resp.json()["data"]])


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_similarity_is_the_cosine_of_the_embeddings(
    via: str, server: TestClient, gateway: TestClient
) -> None:
    client = server if via == "server" else gateway
    body = {"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}}
    got = client.post("/similarity", json=body)
    assert got.status_code == 200, got.text
    vectors = _vectors(server, [SOURCE, *SENTENCES])
    np.testing.assert_allclose(got.json(), vectors[1:] @ vectors[0], atol=1e-5)
    assert client.post("/", json=body).json() == pytest.approx(got.json(), abs=1e-6)  # TEI's base route
    empty = client.post("/similarity", json={"inputs": {"source_sentence": SOURCE, "sentences": []}})
    assert empty.status_code == 422 and "sentences" in empty.json()["error"]["message"]


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_base_route_embeds_with_huggingface_hub_parameters(
    via: str, server: TestClient, gateway: TestClient
) -> None:
    client = server if via == "server" else gateway
    hub = {"inputs": SENTENCES[:2], "parameters": {"normalize": False, "truncate": None, "prompt_name": None}}
    got = client.post("/", json=hub)
    assert got.status_code == 200, got.text
    np.testing.assert_allclose(got.json(), _vectors(server, SENTENCES[:2], normalize=False), atol=1e-5)
    clash = client.post("/", json={"inputs": "x", "normalize": True, "parameters": {"normalize": False}})
    assert clash.status_code == 422 and "parameters" in clash.json()["error"]["message"]


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_decode_and_the_get_routes(via: str, server: TestClient, gateway: TestClient) -> None:
    client = server if via == "server" else gateway
    ids = client.post("/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    assert client.post("/decode", json={"ids": ids}).json() == ["hello world"]
    both = client.post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False})
    assert both.json() == ["[CLS] hello world [SEP]", "hello"]
    outside = client.post("/decode", json={"ids": [30522]})
    assert outside.status_code == 400 and "30522" in outside.json()["error"]["message"]
    for path in ("/health", "/ping"):
        assert client.get(path).status_code == 200
    assert client.post("/ping").status_code == 200
    assert client.get("/version").json()["version"]
    listed = client.get("/models").json()  # Infinity's path: /v1/models' list
    assert [m["id"] for m in listed["data"]] == [m["id"] for m in client.get("/v1/models").json()["data"]]


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_invocations_and_infinitys_embeddings_pick_the_route(
    via: str, server: TestClient, gateway: TestClient
) -> None:
    client = server if via == "server" else gateway
    want = _vectors(server, SENTENCES)
    for path, body in (("/invocations", {"input": SENTENCES}), ("/embeddings", {"input": SENTENCES})):
        got = client.post(path, json=body)
        assert got.status_code == 200, got.text
        np.testing.assert_allclose([d["embedding"] for d in got.json()["data"]], want, atol=1e-5)
    chat = client.post("/invocations", json={"messages": [{"role": "user", "content": SOURCE}]})
    assert chat.status_code == 200, chat.text
    rerank = client.post("/invocations", json={"query": SOURCE, "documents": SENTENCES})
    assert rerank.status_code == 400 and "POST /v1/embeddings" in rerank.json()["error"]["message"]
    unknown = client.post("/invocations", json={"prompt": "x"})
    assert unknown.status_code == 400 and "picks its route by the body" in unknown.json()["error"]["message"]


@pytest.mark.parametrize("labels", [None, ["negative", "positive"]], ids=["reranker", "classifier"])
def test_base_route_follows_the_models_kind(tmp_path: Path, labels: list[str] | None) -> None:
    model = build_cross_encoder(tmp_path / "ce", labels=labels)
    with server_client(model) as server:
        gateway = TestClient(gateway_app(server.app, model, pools=POOLS))
        for client in (server, gateway):
            if labels is None:  # a reranker: TEI's /rerank body
                body = {"query": SOURCE, "texts": SENTENCES[:2]}
                assert client.post("/", json=body).json() == server.post("/rerank", json=body).json()
            else:  # a classifier: TEI's /predict body, and huggingface_hub's
                want = server.post("/predict", json={"inputs": SOURCE}).json()
                assert client.post("/", json={"inputs": SOURCE}).json() == want
                got = client.post("/", json={"inputs": SOURCE, "parameters": {"top_k": None}}).json()
                assert got == want
            via = client.post("/invocations", json={"input": [SOURCE]})
            assert via.status_code == 200 and via.json()["data"][0]["index"] == 0, via.text


def test_huggingface_hub_inference_client_on_the_base_url(
    server: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # loopback only: the threaded server
    with threaded_server(server.app) as url:
        hub = InferenceClient(model=url)
        vector = hub.feature_extraction(SOURCE)
        scores = hub.sentence_similarity(SOURCE, SENTENCES)
    np.testing.assert_allclose(np.asarray(vector).reshape(1, -1), _vectors(server, [SOURCE]), atol=1e-6)
    vectors = _vectors(server, [SOURCE, *SENTENCES])
    np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], atol=1e-5)
    classifier = build_cross_encoder(tmp_path / "clf", labels=["negative", "positive"])
    with server_client(classifier) as clf, threaded_server(clf.app) as url:
        labels = InferenceClient(model=url).text_classification(SOURCE)
        want = clf.post("/predict", json={"inputs": SOURCE}).json()
    assert [(x.label, round(x.score, 5)) for x in np.atleast_1d(labels)][:1] == [
        (want[0]["label"], round(want[0]["score"], 5))
    ]


def _hidden_states(ids: list[int]) -> np.ndarray:
    """transformers' last hidden states of one input (the independent reference)."""
    import torch

    from tests.helpers.reference import hf_model

    with torch.inference_mode():
        return hf_model(str(minilm_dir()))(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_embed_all_and_pooling_token_embed_are_every_tokens_hidden_state(
    via: str, server: TestClient, gateway: TestClient
) -> None:
    client = server if via == "server" else gateway
    texts = [SOURCE, SENTENCES[2]]
    got = client.post("/embed_all", json={"inputs": texts})
    assert got.status_code == 200, got.text
    for text, rows in zip(texts, got.json(), strict=True):
        ids = server.post("/tokenize", json={"prompt": text}).json()["tokens"]
        want = _hidden_states(ids)
        assert np.asarray(rows).shape == want.shape  # [CLS] and [SEP] rows included, as TEI's
        np.testing.assert_allclose(rows, want, atol=2e-4)
    pooled = client.post("/pooling", json={"input": texts, "task": "token_embed"})
    assert pooled.status_code == 200, pooled.text
    body = pooled.json()
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "pooling"
    np.testing.assert_allclose(body["data"][1]["data"], got.json()[1], atol=1e-5)
    assert body["usage"]["prompt_tokens"] == sum(len(r) for r in got.json())


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_pooling_embed_is_the_embeddings_vector(via: str, server: TestClient, gateway: TestClient) -> None:
    client = server if via == "server" else gateway
    got = client.post("/pooling", json={"input": SENTENCES, "dimensions": 8})
    assert got.status_code == 200, got.text
    vectors = [d["data"] for d in got.json()["data"]]
    np.testing.assert_allclose(vectors, _vectors(server, SENTENCES, dimensions=8), atol=1e-5)
    bad = client.post("/pooling", json={"input": "x", "task": "token_embed", "normalize": True})
    assert bad.status_code == 400 and "raw vector" in bad.json()["error"]["message"]
    over = client.post("/embed_all", json={"inputs": "wing " * 400})
    assert over.status_code == 400 and "truncate: true" in over.json()["error"]["message"]


def test_openai_client_infinity_style_and_vllms_chat_embeddings(server: TestClient) -> None:
    """The openai package unchanged: on the base URL as Infinity's docs call it (`/embeddings`),
    on `/v1`, and vLLM's chat-embedding body through the client's own `post`."""
    from openai import OpenAI

    want = _vectors(server, SENTENCES)
    model = server.get("/v1/models").json()["data"][0]["id"]
    with threaded_server(server.app) as url:
        for base in (url, f"{url}/v1"):
            got = OpenAI(base_url=base, api_key="unused").embeddings.create(model=model, input=SENTENCES)
            np.testing.assert_allclose([d.embedding for d in got.data], want, atol=1e-6)
        chat = OpenAI(base_url=f"{url}/v1", api_key="unused").post(
            "/embeddings",
            cast_to=object,
            body={
                "model": model,
                "messages": [{"role": "user", "content": SOURCE}],
                "encoding_format": "float",
            },
        )
    np.testing.assert_allclose(chat["data"][0]["embedding"], _vectors(server, [SOURCE])[0], atol=1e-6)  # type: ignore[index]


def test_langchain_openai_embeddings_with_its_setting_for_other_servers(server: TestClient) -> None:
    """LangChain's OpenAIEmbeddings, configured as its docs say for non-OpenAI servers."""
    import langchain_openai

    model = server.get("/v1/models").json()["data"][0]["id"]
    with threaded_server(server.app) as url:
        lc = langchain_openai.OpenAIEmbeddings(
            model=model, base_url=f"{url}/v1", api_key="unused", check_embedding_ctx_length=False
        )
        docs, query = lc.embed_documents(SENTENCES), lc.embed_query(SOURCE)
    np.testing.assert_allclose(docs, _vectors(server, SENTENCES), atol=1e-6)
    np.testing.assert_allclose(query, _vectors(server, [SOURCE])[0], atol=1e-6)


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_a_405_names_every_method_of_the_path(via: str, server: TestClient, gateway: TestClient) -> None:
    client = server if via == "server" else gateway
    ping = client.put("/ping")  # GET and POST are separate routes at one path
    assert ping.status_code == 405 and ping.headers["allow"] == "GET, POST", ping.headers
    files = client.request("OPTIONS", "/v1/files/file-x")  # the batch API: GET and DELETE
    assert files.status_code == 405 and files.headers["allow"] == "DELETE, GET", files.headers


def test_cohere_client_v2_embed(server: TestClient) -> None:
    """Cohere's own client (ClientV2) pointed at the server: `/v2/embed` with its body as sent."""
    import cohere

    model = server.get("/v1/models").json()["data"][0]["id"]
    with threaded_server(server.app) as url:
        co = cohere.ClientV2(api_key="unused", base_url=url)
        got = co.embed(model=model, texts=SENTENCES, input_type="search_document", embedding_types=["float"])
    np.testing.assert_allclose(got.embeddings.float_, _vectors(server, SENTENCES), atol=1e-6)
