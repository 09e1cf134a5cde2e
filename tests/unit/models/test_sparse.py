"""SPLADE sparse vectors (issue #44) against sentence-transformers' SparseEncoder on real
all-MiniLM-L6-v2 encoder weights with a seeded masked-LM head: the same non-zero indices and
values within 1e-5 (max and sum folds, relu and log1p_relu), the fold by slices of rows and by
chunks equal to one pass, `--deterministic` bit-identical across budgets, and the API
(`embedding_type: sparse` with the openai client, top-k, tokens, refusals)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.models import sparse_head
from embedserve.pooling.state import PoolingState
from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import server_client
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_sparse import build_splade

TEXTS = [
    "hello world",
    "SPLADE keeps exact terms: the error code E1234 and the name Zyxwv",
    "naïve café, 東京 and emoji 🙂 too",
    "the python programming language " * 40,  # ~200 tokens
]


@pytest.fixture(scope="module")
def splade_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("splade")
    return {
        "max": build_splade(root / "max"),
        "sum-log1p": build_splade(root / "sum-log1p", strategy="sum", activation="log1p_relu", seed=1),
    }


def _reference(path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    enc = SparseEncoder(str(path), device="cpu")
    return enc.encode(texts, convert_to_tensor=True, batch_size=2).to_dense().numpy()


@pytest.mark.parametrize("kind", ["max", "sum-log1p"])
def test_sparse_vectors_equal_sparse_encoder(splade_dirs: dict[str, Path], kind: str) -> None:
    path = splade_dirs[kind]
    ref = _reference(path, TEXTS)
    with Engine.from_pretrained(path, max_num_batched_tokens=512) as engine:
        batched = np.stack(engine.embed(TEXTS))
        alone = np.stack([engine.embed([t])[0] for t in TEXTS])
    for got in (batched, alone):
        assert got.shape == ref.shape == (len(TEXTS), 30522)
        for g, r in zip(got, ref, strict=True):
            assert np.array_equal(np.flatnonzero(g), np.flatnonzero(r))  # the same terms
            # 1e-5 of the largest weight (a sum over 200 tokens reaches ~40: fp32 sums differ there)
            assert np.abs(g - r).max() <= 1e-5 * max(1.0, float(r.max())), (np.abs(g - r).max(), r.max())
    assert 50 < np.count_nonzero(batched[0]) < 5000  # sparse, and not empty


def test_the_fold_by_slices_and_by_chunks_equals_one_pass(
    splade_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedserve.engine.builder import build_engine

    head = build_engine(splade_dirs["max"]).sparse_head
    assert head is not None
    rows = torch.randn(300, 384, generator=torch.Generator().manual_seed(0))
    whole = head.weights(rows)
    seen: list[int] = []
    real = sparse_head.SparseHead._term_weights

    def term_weights(self: sparse_head.SparseHead, x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return real(self, x)

    monkeypatch.setattr(sparse_head.SparseHead, "_term_weights", term_weights)
    monkeypatch.setattr(sparse_head, "ROWS_PER_SLICE", 7)
    # (matmuls of other row counts round differently: equal to float32 rounding, not bit for bit)
    torch.testing.assert_close(head.weights(rows), whole, rtol=1e-5, atol=1e-5)
    assert max(seen) == 7 and sum(seen) == 300  # never [300, vocab] logits at once
    state = PoolingState(PoolingMethod.SPLADE, 300, sparse_head=head)
    for start, n in ((0, 100), (100, 150), (250, 50)):  # three chunks, as chunked prefill folds
        state.update(start, n, rows[start : start + n])
    torch.testing.assert_close(state.finish(), whole, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="sparse head"):
        PoolingState(PoolingMethod.SPLADE, 3)


def test_deterministic_sparse_vectors_are_bit_identical_across_budgets(splade_dirs: dict[str, Path]) -> None:
    runs = []
    for budget in (512, 2048):
        with Engine.from_pretrained(
            splade_dirs["max"], deterministic=True, max_num_batched_tokens=budget
        ) as e:
            runs.append(np.stack(e.embed(TEXTS)))
    assert np.array_equal(runs[0], runs[1])


def test_sparse_through_the_openai_client_and_the_api_options(splade_dirs: dict[str, Path]) -> None:
    path = splade_dirs["max"]
    ref = _reference(path, TEXTS[:2])
    with server_client(path) as c, threaded_server(c.app) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        resp = client.embeddings.create(model="max", input=TEXTS[:2], extra_body={"embedding_type": "sparse"})
        for item, r in zip(resp.data, ref, strict=True):
            sparse = item.embedding
            assert isinstance(sparse, dict)
            idx, vals = np.array(sparse["indices"]), np.array(sparse["values"])
            assert np.array_equal(idx, np.flatnonzero(r)) and np.abs(vals - r[idx]).max() <= 1e-5
        assert resp.usage.prompt_tokens > 0
        top = c.post(
            "/v1/embeddings",
            json={"input": TEXTS[1], "embedding_type": "sparse", "sparse_top_k": 5, "return_tokens": True},
        ).json()
        emb = top["data"][0]["embedding"]
        assert emb["indices"] == sorted(np.argsort(-ref[1], kind="stable")[:5].tolist())  # the 5 largest
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        assert emb["tokens"] == [tok.id_to_token(i) for i in emb["indices"]]
        dense_schema = c.post("/v1/embeddings", json={"input": "x", "embedding_type": "sparse"}).json()
        assert dense_schema["embedding_schema"].startswith("es1-")
        refusals = [
            ({"input": "x"}, 400, "produces sparse vectors"),
            ({"input": "x", "embedding_type": "sparse", "sparse_top_k": 0}, 422, "sparse_top_k"),
            ({"input": "x", "return_tokens": True}, 400, "embedding_type 'sparse' only"),
            ({"input": "x", "embedding_type": "sparse", "dimensions": 8}, 400, "dimensions"),
            ({"input": "word " * 600, "embedding_type": "sparse", "truncate": "error"}, 400, "tokens"),
        ]
        for body, status, words in refusals:
            r = c.post("/v1/embeddings", json=body)
            assert r.status_code == status and words in r.json()["error"]["message"], (body, r.text)
        assert (
            c.post("/v1/embeddings", json={"input": "still fine", "embedding_type": "sparse"}).status_code
            == 200
        )


def test_a_dense_model_refuses_sparse_naming_what_it_produces() -> None:
    with server_client(minilm_dir()) as c:
        r = c.post("/v1/embeddings", json={"input": "x", "embedding_type": "sparse"})
        assert r.status_code == 400 and "produces dense vectors" in r.json()["error"]["message"]


def test_splade_pooling_is_never_forced_on_another_model() -> None:
    from embedserve.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="SparseEncoder directory"):
        Engine.from_pretrained(minilm_dir(), pooling="splade")


def test_the_gateway_splits_and_reassembles_sparse_requests(splade_dirs: dict[str, Path]) -> None:
    from fastapi.testclient import TestClient

    from tests.helpers.inprocess import gateway_app

    path = splade_dirs["max"]
    body = {"input": TEXTS, "embedding_type": "sparse", "sparse_top_k": 8}
    with server_client(path) as c:
        direct = [x["embedding"] for x in c.post("/v1/embeddings", json=body).json()["data"]]
        with TestClient(gateway_app(c.app, path)) as g:
            resp = g.post("/v1/embeddings", json=body).json()
    assert [x["embedding"] for x in resp["data"]] == direct
    assert {x["pool"] for x in resp["data"]} == {"short", "long"}  # placed per input by its tokens


def test_tei_embed_sparse_answers_in_teis_shape(splade_dirs: dict[str, Path]) -> None:
    path = splade_dirs["max"]
    with server_client(path) as c:
        ours = c.post("/v1/embeddings", json={"input": TEXTS[:2], "embedding_type": "sparse"}).json()
        tei = c.post("/embed_sparse", json={"inputs": TEXTS[:2]})
        assert tei.status_code == 200
        for weights, item in zip(tei.json(), ours["data"], strict=True):
            assert [w["index"] for w in weights] == item["embedding"]["indices"]
            assert [w["value"] for w in weights] == item["embedding"]["values"]
        one = c.post("/embed_sparse", json={"inputs": "hello world"}).json()
        assert len(one) == 1 and one[0]
        long = c.post("/embed_sparse", json={"inputs": "word " * 600})  # TEI's truncate: false
        assert long.status_code == 400 and "tokens" in long.json()["error"]["message"]
        cut = c.post("/embed_sparse", json={"inputs": "word " * 600, "truncate": True})
        assert cut.status_code == 200
    with server_client(minilm_dir()) as c:
        r = c.post("/embed_sparse", json={"inputs": "x"})
        assert r.status_code == 400 and "produces dense vectors" in r.json()["error"]["message"]


def test_cohere_v2_embed_answers_sparse_directly_and_through_the_gateway(
    splade_dirs: dict[str, Path],
) -> None:
    from fastapi.testclient import TestClient

    from tests.helpers.inprocess import gateway_app

    path = splade_dirs["max"]
    with server_client(path) as c:
        ours = c.post("/v1/embeddings", json={"input": TEXTS, "embedding_type": "sparse"}).json()
        r = c.post("/v2/embed", json={"texts": TEXTS, "embedding_types": ["sparse"]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["embeddings"]["sparse"] == [x["embedding"] for x in ours["data"]]
        assert body["meta"]["billed_units"]["input_tokens"] == ours["usage"]["prompt_tokens"]
        assert set(body["embedding_schemas"]) == {"sparse"}
        for types, words in ((["float"], "produces sparse vectors"), (["sparse", "int8"], "produces sparse")):
            r = c.post("/v2/embed", json={"texts": ["x"], "embedding_types": types})
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        with TestClient(gateway_app(c.app, path)) as g:
            through = g.post("/v2/embed", json={"texts": TEXTS, "embedding_types": ["sparse"]}).json()
        assert through["embeddings"]["sparse"] == body["embeddings"]["sparse"]
    with server_client(minilm_dir()) as c:
        r = c.post("/v2/embed", json={"texts": ["x"], "embedding_types": ["sparse"]})
        assert r.status_code == 400 and "produces dense vectors" in r.json()["error"]["message"]
