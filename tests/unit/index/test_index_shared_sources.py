"""index's embedders are the shared vector sources with index's policies on top: the one HTTP client
(embedders/http.py) and the one engine adapter (embedders/engine.py) that parity and bench use."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from embedserve.embedders import open_source
from embedserve.embedders.engine import EngineSource
from embedserve.embedders.http import EmbeddingsClient
from embedserve.embedders.http_source import HttpSource
from embedserve.embedders.spec import parse_spec
from embedserve.engine.options import EngineOptions
from embedserve.index.embedder import EmbedderSpec, VectorMeta
from embedserve.index.embedders import build_embedder
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.errors import EndpointError
from embedserve.index.http_embedder import HttpEmbedder
from tests.helpers.inprocess import Via, server_client
from tests.helpers.openai_stub import StubState, serve_stub
from tests.helpers.tiny_models import QUERY_PROMPT

TEXTS = [
    "Flutter of a swept wing at transonic speed.",
    "An oblique shock wave reflects from the wall of the channel.",
    "The boundary layer separates behind the shock.",
    "Heat transfer in a hypersonic stagnation region.",
]
META = [f.name for f in dataclasses.fields(VectorMeta)]
SRC = Path(__file__).resolve().parents[3] / "src" / "embedserve"


@pytest.fixture(scope="module")
def server(qwen3_dir: Path) -> Iterator[TestClient]:
    # Without the prefix cache: the second source's requests would start from the first's
    # cached blocks, equal to rounding only.
    with server_client(qwen3_dir, engine=EngineOptions(enable_prefix_caching=False)) as client:
        yield client


@pytest.fixture(scope="module")
def det_server(qwen3_dir: Path) -> Iterator[TestClient]:
    """For comparing two sources bit for bit: also deterministic, so a vector does not depend on
    how its prompt was cut into steps (index sends batch work, whose steps are sized by the
    engine's measured speed: scheduler/policy.py)."""
    options = EngineOptions(enable_prefix_caching=False, deterministic=True)
    with server_client(qwen3_dir, engine=options) as client:
        yield client


def _parity_http(client: TestClient) -> HttpSource:
    """parity's http source on the app; not closed by the tests (that would close the TestClient)."""
    source = HttpSource(parse_spec("http://testserver?model=qwen3", "parity"))
    source.client.http.close()
    source.client.http = client
    return source


def test_index_and_parity_http_sources_agree_on_one_server(det_server: TestClient) -> None:
    server = det_server
    index = HttpEmbedder("http://testserver", transport=Via(server))
    parity = _parity_http(server)
    try:
        # Documents: the model's "document" prompt is empty; queries: index names the prompt,
        # parity puts its text first: the same inputs, the same vectors (base64 or JSON floats).
        np.testing.assert_array_equal(index.embed_documents(TEXTS), parity.embed(TEXTS, ""))
        np.testing.assert_array_equal(index.embed_queries(TEXTS), parity.embed(TEXTS, QUERY_PROMPT))
        described = parity.describe()
    finally:
        index.close()
    served = server.post("/v1/embeddings", json={"input": ["x"]}).json()
    assert index.meta.fields() == {k: served[k] for k in META} == {k: described[k] for k in META}
    assert index.dimension == len(served["data"][0]["embedding"]) and index.max_tokens is not None


def test_index_engine_embedder_is_the_engine_source(qwen3_dir: Path, server: TestClient) -> None:
    options = EngineOptions(max_model_len=128)
    index = build_embedder(EmbedderSpec(model=str(qwen3_dir), engine=options))
    parity = open_source(parse_spec(f"engine:{qwen3_dir}?max_model_len=128", "parity"))
    try:
        assert isinstance(index, EngineEmbedder) and isinstance(index.source, EngineSource)
        assert index.source.options == options and index.max_tokens == 128
        # The vector metadata `embedserve serve` reports for the same files, computed once.
        served = server.post("/v1/embeddings", json={"input": ["x"]}).json()
        described = parity.describe()
        assert index.meta.fields() == {k: served[k] for k in META} == {k: described[k] for k in META}
        np.testing.assert_allclose(index.embed_documents(TEXTS), parity.embed(TEXTS, ""), rtol=0, atol=1e-6)
    finally:
        index.close()
        parity.close()


def test_a_request_too_large_for_a_real_server_is_halved(qwen3_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(qwen3_dir / "tokenizer.json"))
    counts = [len(tokenizer.encode(t).ids) for t in TEXTS]
    limit = max(counts) + min(counts)  # any one text fits, all four never do
    sent: list[int] = []
    real_embed = EmbeddingsClient.embed

    def embed(self: EmbeddingsClient, payload: list[Any], *args: Any, **kw: Any) -> Any:
        sent.append(len(payload))
        return real_embed(self, payload, *args, **kw)

    with server_client(qwen3_dir, max_queued_tokens=limit) as client, pytest.MonkeyPatch.context() as mp:
        mp.setattr(EmbeddingsClient, "embed", embed)
        index = HttpEmbedder("http://testserver", transport=Via(client))
        try:
            halved = index.embed_documents(TEXTS)
            one_by_one = np.concatenate([index.embed_documents([t]) for t in TEXTS])
        finally:
            index.close()
    assert sent[1] == len(TEXTS) and sent[2] < len(TEXTS)  # the probe, refused, then halves
    np.testing.assert_allclose(halved, one_by_one, rtol=0, atol=1e-6)


def test_backpressure_waits_go_through_the_shared_client(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = {
        "model_version": "v",
        "dtype": "float32",
        "backend_profile": "cpu-fp32",
        "embedding_schema": "es1-x",
    }
    state = StubState(lambda inputs: [[1.0, 0.0]] * len(inputs), metadata=meta)
    waited: list[str] = []
    real_send = EmbeddingsClient.send

    def send(self: EmbeddingsClient, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        waited.append(url)
        return real_send(self, method, url, body)

    monkeypatch.setattr(EmbeddingsClient, "send", send)
    with serve_stub(state) as url:
        index = HttpEmbedder(url, model="stub-model")
        impatient = HttpEmbedder(url, model="stub-model", max_wait_s=0)
        try:
            state.refusals = [429, 503]
            assert index.embed_documents(["a"]).shape == (1, 2)
            assert len(state.requests) == 5  # two probes, two refusals waited out, the answer
            state.refusals = [429]
            with pytest.raises(EndpointError, match=r"/v1/embeddings answered 429: .*busy"):
                impatient.embed_documents(["a"])
        finally:
            index.close()
            impatient.close()
    assert waited and all(u.startswith(url) for u in waited)
    assert index.meta.model == "stub-model" and index.meta.embedding_schema == "es1-x"


def test_one_engine_opener_and_one_embeddings_client() -> None:
    """Only embedders/engine.py opens an engine and only embedders/http.py speaks the embeddings
    wire format synchronously, for every tool on the shared sources."""
    tools = [p for d in ("embedders", "index", "parity", "bench") for p in (SRC / d).rglob("*.py")]
    opens = {p.relative_to(SRC).as_posix() for p in tools if "Engine.from_pretrained(" in p.read_text()}
    assert opens == {"embedders/engine.py"}
    clients = {p.relative_to(SRC).as_posix() for p in tools if "httpx.Client(" in p.read_text()}
    assert clients <= {"embedders/http.py", "embedders/scorers.py"}  # scorers: POST /v1/rerank
