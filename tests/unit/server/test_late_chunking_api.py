"""Late chunking as users call it: `POST /v1/embeddings` with `late_chunking` through the openai
client, curl-style JSON and the gateway; a 16K-token document against transformers; the
refusals, each naming the problem, with the server still answering."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from fastapi.testclient import TestClient

from embedserve import Engine
from embedserve.engine.options import EngineOptions
from tests.helpers.engine_calls import embed_late, tokenize_late
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import gateway_app, runtime_of, server_client
from tests.helpers.real_text import long_text, topic
from tests.helpers.reference import hf_model

CHUNKS = ["Berlin is the capital of Germany. ", "It has 3.8 million people. ", "Its river is the Spree."]


def test_openai_client_gets_one_vector_per_chunk_equal_to_the_engine(qwen3_dir: Path) -> None:
    with server_client(qwen3_dir) as c, threaded_server(c.app) as base:
        engine = runtime_of(c).engine
        assert engine is not None
        want = embed_late(engine, CHUNKS)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        resp = client.embeddings.create(model="qwen3", input=CHUNKS, extra_body={"late_chunking": True})
        got = np.array([d.embedding for d in resp.data], dtype=np.float32)  # base64 on the wire
        assert np.array_equal(got, want.embeddings)
        assert [d.index for d in resp.data] == [0, 1, 2]
        assert resp.usage.prompt_tokens == want.num_tokens
        plain = c.post("/v1/embeddings", json={"input": CHUNKS}).json()
        body = c.post("/v1/embeddings", json={"input": CHUNKS, "late_chunking": True}).json()
    assert np.array_equal(np.array([d["embedding"] for d in body["data"]], dtype=np.float32), got)
    joined = "".join(CHUNKS)
    for d, chunk, span in zip(body["data"], CHUNKS, want.chunks, strict=True):
        a, b = d["char_range"]
        assert joined[a:b] == chunk and d["token_range"] == list(span.tokens)
        assert d["num_tokens"] == span.tokens[1] - span.tokens[0] and d["truncated"] is False
    # a chunk pooled inside its document is another vector space than a chunk alone
    assert body["embedding_schema"] != plain["embedding_schema"]
    assert body["model_version"] == plain["model_version"]


def test_the_document_forms_spans_size_and_the_output_options(qwen3_dir: Path) -> None:
    doc = "".join(CHUNKS)
    spans = [[0, 34], [34, 61], [61, len(doc)]]
    with server_client(qwen3_dir) as c:
        by_chunks = c.post("/v1/embeddings", json={"input": CHUNKS, "late_chunking": True}).json()
        by_spans = c.post(
            "/v1/embeddings", json={"input": doc, "late_chunking": True, "chunk_spans": spans}
        ).json()
        assert [d["embedding"] for d in by_spans["data"]] == [d["embedding"] for d in by_chunks["data"]]
        sized = c.post("/v1/embeddings", json={"input": doc, "late_chunking": True, "late_chunk_size": 5})
        items = sized.json()["data"]
        assert [d["num_tokens"] for d in items[:-1]] == [5] * (len(items) - 1)
        assert items[-1]["token_range"][1] == sized.json()["usage"]["prompt_tokens"]  # with <|endoftext|>
        small = c.post(
            "/v1/embeddings",
            json={"input": CHUNKS, "late_chunking": True, "dimensions": 16, "embedding_type": "binary"},
        ).json()
        assert [len(d["embedding"]) for d in small["data"]] == [2, 2, 2]  # 16 bits each
        last = c.post(
            "/v1/embeddings", json={"input": CHUNKS, "late_chunking": True, "span_pooling": "last"}
        ).json()
        assert last["embedding_schema"] != by_chunks["embedding_schema"]


def test_the_gateway_routes_the_document_whole(qwen3_dir: Path) -> None:
    body = {"input": [topic("assert"), topic("pass")], "late_chunking": True}
    with server_client(qwen3_dir) as c:
        direct = c.post("/v1/embeddings", json=body).json()
        with TestClient(gateway_app(c.app, qwen3_dir)) as g:
            resp = g.post("/v1/embeddings", json=body).json()
    assert [d["embedding"] for d in resp["data"]] == [d["embedding"] for d in direct["data"]]
    assert {d["pool"] for d in resp["data"]} == {"long"}  # counted whole: over the short pool's 64
    assert resp["usage"] == direct["usage"] and resp["embedding_schema"] == direct["embedding_schema"]


def test_refusals_are_clear_and_disturb_nothing(qwen3_dir: Path) -> None:
    late = {"late_chunking": True}
    cases = [
        ({"input": [], **late}, 400, "input is empty"),
        ({"input": ["a", ""], **late}, 400, "chunk 1 is an empty string"),
        ({"input": "abcdef", **late, "chunk_spans": [[0, 4], [3, 6]]}, 400, "overlaps"),
        ({"input": "abcdef", **late, "chunk_spans": [[0, 9]]}, 400, "outside the document"),
        ({"input": "abcdef", **late, "late_chunk_size": 0}, 422, "late_chunk_size"),
        ({"input": "abcdef", **late}, 422, "chunk_spans or late_chunk_size"),
        ({"input": ["ab", "cd"], **late, "chunk_spans": [[0, 1]]}, 422, "one document string"),
        ({"input": "abcdef", "chunk_spans": [[0, 3]]}, 422, "applies with late_chunking: true"),
        ({"input": [[1, 2, 3]], **late}, 422, "takes text"),
        ({"input": ["The strawb", "er", "ry"], **late}, 400, "chunk 1 (characters [10, 12)) has no token"),
        ({"input": ["ab"], **late, "embedding_type": "sparse"}, 422, "pools dense vectors"),
        ({"input": ["word " * 40_000], **late}, 400, "tokens"),
    ]
    with server_client(qwen3_dir, engine=EngineOptions(max_model_len=1024)) as c:
        for body, status, words in cases:
            r = c.post("/v1/embeddings", json=body)
            assert r.status_code == status and words in r.json()["error"]["message"], (body, r.text)
        cut = c.post("/v1/embeddings", json={"input": ["word " * 2000, "tail"], **late, "truncate": "end"})
        assert cut.status_code == 200 and [d["index"] for d in cut.json()["data"]] == [0]  # "tail" cut off
        assert cut.json()["data"][0]["truncated"] is True
        assert c.post("/v1/embeddings", json={"input": CHUNKS, **late}).status_code == 200


def test_the_request_limit_counts_chunks(qwen3_dir: Path) -> None:
    with server_client(qwen3_dir, max_inputs_per_request=4) as c:
        r = c.post("/v1/embeddings", json={"input": list("abcde"), "late_chunking": True})
        assert r.status_code == 400 and "5 inputs" in r.json()["error"]["message"]
        doc = {"input": "one two three four five six", "late_chunking": True, "late_chunk_size": 1}
        r = c.post("/v1/embeddings", json=doc)
        assert r.status_code == 400 and "at most 4 vectors" in r.json()["error"]["message"]
        assert c.post("/v1/embeddings", json={**doc, "late_chunk_size": 2}).status_code == 200


def test_an_encoder_refuses_span_pooling_last() -> None:
    from tests.helpers.tiny_bert import minilm_dir

    with server_client(minilm_dir()) as c:
        r = c.post(
            "/v1/embeddings", json={"input": ["a b", "c d"], "late_chunking": True, "span_pooling": "last"}
        )
        assert r.status_code == 400 and "bidirectional encoder" in r.json()["error"]["message"]


# CI time (2026-12-07): chunked prefill runs in CI, the lane with `-m slow`
@pytest.mark.parametrize(
    "lane", [0, pytest.param(None, marks=pytest.mark.slow)], ids=["chunked prefill", "layer-major lane"]
)
def test_a_16k_document_against_transformers(qwen3_dir: Path, lane: int | None) -> None:
    """The real Qwen3 tokenizer, 16,384 tokens (truncated at the end), 1,000-token chunks."""
    with Engine.from_pretrained(
        qwen3_dir, max_model_len=16_384, max_num_batched_tokens=2048, layer_major_tokens=lane
    ) as engine:
        out = embed_late(engine, long_text(90_000), chunk_size=1000, truncate="end")
        ids = tokenize_late(engine, long_text(90_000), chunk_size=1000, truncate="end").token_ids
        if lane is None:
            assert engine.stats()["layer_major_finished"] == 1
    assert out.truncated and out.num_tokens == len(ids) == 16_384 and len(out.chunks) == 17
    with torch.inference_mode():
        hidden = hf_model(str(qwen3_dir))(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
    want = torch.stack([hidden[a:b].mean(0) for a, b in (c.tokens for c in out.chunks)])
    np.testing.assert_allclose(out.embeddings, torch.nn.functional.normalize(want, dim=-1).numpy(), atol=1e-5)


def test_long_late_chunking_through_the_api(qwen3_dir: Path) -> None:
    doc = long_text(7000)[:7000]
    body = {"input": doc, "late_chunking": True, "late_chunk_size": 100, "long_late_chunking": True}
    with server_client(qwen3_dir, engine=EngineOptions(max_model_len=512)) as c:
        engine = runtime_of(c).engine
        assert engine is not None
        want = embed_late(engine, doc, chunk_size=100, long=True, overlap=32)
        got = c.post("/v1/embeddings", json={**body, "late_overlap": 32}).json()
        assert np.array_equal(
            np.array([d["embedding"] for d in got["data"]], dtype=np.float32), want.embeddings
        )
        summary = got["late_chunking"]
        assert summary == {"num_tokens": want.num_tokens, "windows": want.windows, "overlap_tokens": 32}
        assert want.windows >= 3 and got["usage"]["prompt_tokens"] > want.num_tokens  # overlaps count
        default = c.post("/v1/embeddings", json=body).json()
        assert default["late_chunking"]["overlap_tokens"] == 512 // 8
        # the window layout is part of the schema (a chunk's vector depends on it)
        plain = c.post(
            "/v1/embeddings", json={**body, "long_late_chunking": False, "input": doc[:500]}
        ).json()
        assert len({got["embedding_schema"], default["embedding_schema"], plain["embedding_schema"]}) == 3
        refusals = [
            ({**body, "late_overlap": 300}, 400, "must be under half of that"),
            ({**body, "truncate": "end"}, 422, "truncate does not apply"),
            (
                {**body, "long_late_chunking": False, "late_overlap": 8},
                422,
                "applies with long_late_chunking",
            ),
            ({"input": doc, "long_late_chunking": True}, 422, "applies with late_chunking: true"),
        ]
        for bad, status, words in refusals:
            r = c.post("/v1/embeddings", json=bad)
            assert r.status_code == status and words in r.json()["error"]["message"], (bad, r.text)
        with TestClient(gateway_app(c.app, qwen3_dir)) as g:
            through = g.post("/v1/embeddings", json={**body, "late_overlap": 32}).json()
    assert [d["embedding"] for d in through["data"]] == [d["embedding"] for d in got["data"]]
    assert (
        through["late_chunking"] == got["late_chunking"]
        and through["embedding_schema"] == got["embedding_schema"]
    )
