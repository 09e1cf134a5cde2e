"""BGE-M3 (an XLM-R encoder with `sparse_linear.pt`): dense vectors are its normalized CLS rows;
sparse vectors are FlagEmbedding's lexical weights (relu(sparse_linear(row)), the largest per
token id, special tokens left out), computed here from transformers' last_hidden_state; across
batches; through /v1/embeddings, /embed_sparse and /v2/embed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.engine.ask import Ask, Prepared, answers_as
from embedserve.engine.lexical import OnePassOutput
from embedserve.pooling.outputs import Output
from tests.helpers.engine_calls import embed_lexical, embed_multivector
from tests.helpers.inprocess import server_client
from tests.helpers.real_text import topic
from tests.helpers.reference import hf_model
from tests.helpers.tiny_sparse import build_bge_m3

TEXTS = ["What is BGE M3?", topic("assert")[:1500], "Defination of BM25 [UNK] word"]


@pytest.fixture(scope="module")
def m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bge_m3(tmp_path_factory.mktemp("bge-m3") / "m3")


def _reference(path: Path, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(normalized CLS rows, lexical weights as FlagEmbedding's _process_token_weights, its
    unused tokens from transformers' tokenizer: cls, eos, pad, unk)."""
    from transformers import AutoTokenizer

    state = torch.load(path / "sparse_linear.pt", weights_only=True)
    tok = AutoTokenizer.from_pretrained(str(path))
    unused = {tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    dense, sparse = [], []
    with torch.inference_mode():
        for seq in ids:
            hidden = hf_model(str(path))(input_ids=torch.tensor([seq])).last_hidden_state[0].float()
            dense.append(torch.nn.functional.normalize(hidden[0], dim=-1).numpy())
            weights = torch.relu(hidden @ state["weight"][0] + state["bias"][0]).numpy()
            vec = np.zeros(30522, dtype=np.float32)
            for w, i in zip(weights, seq, strict=True):
                if i not in unused and w > 0 and w > vec[i]:
                    vec[i] = w
            sparse.append(vec)
    return np.stack(dense), np.stack(sparse)


def test_dense_and_lexical_weights_equal_the_reference(m3: Path) -> None:
    with Engine.from_pretrained(m3, max_num_batched_tokens=1024) as engine:
        ids = [t.token_ids for t in engine.renderer.text(TEXTS)]
        dense = engine.embed(TEXTS)
        sparse = embed_lexical(engine, TEXTS)
        alone = np.stack([embed_lexical(engine, [t])[0] for t in TEXTS])
    want_dense, want_sparse = _reference(m3, ids)
    np.testing.assert_allclose(dense, want_dense, atol=1e-5)
    assert [np.flatnonzero(s).tolist() for s in sparse] == [np.flatnonzero(w).tolist() for w in want_sparse]
    np.testing.assert_allclose(sparse, want_sparse, atol=1e-5)
    np.testing.assert_allclose(sparse, alone, atol=1e-6)  # batched as alone
    assert 0 < np.count_nonzero(sparse[1]) < len(set(ids[1]))  # some weights are zero, specials never


def test_one_pass_gives_both_as_the_reference(m3: Path) -> None:
    import asyncio

    with Engine.from_pretrained(m3) as engine:
        tokenized = engine.renderer.text(TEXTS)
        ask = Ask(dimensions=32, extras=frozenset({Output.LEXICAL, Output.MULTIVECTOR}))
        passes = answers_as(asyncio.run(engine.run_async(Prepared(ask, tokenized))), OnePassOutput)
        one = SimpleNamespace(
            dense=np.stack([p.dense for p in passes]),
            sparse=np.stack([p.lexical for p in passes]),
            multivector=[p.multivector for p in passes],
            outputs=[p.output for p in passes],
        )
        steps = engine.stats()["steps"]
        tokens = embed_multivector(engine, TEXTS, dimensions=32)  # a pass of their own
    want_dense, want_sparse = _reference(m3, [t.token_ids for t in tokenized])
    want_dense = torch.nn.functional.normalize(torch.from_numpy(want_dense[:, :32]), dim=-1).numpy()
    np.testing.assert_allclose(one.dense, want_dense, atol=1e-5)  # Matryoshka 32, normalized after slicing
    np.testing.assert_allclose(one.sparse, want_sparse, atol=1e-5)
    assert one.multivector is not None
    for got, want, t in zip(one.multivector, tokens, tokenized, strict=True):
        assert got.shape == (len(t.token_ids) - 1, 32)  # every token but CLS
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert steps == 1 and [o.num_tokens for o in one.outputs] == [len(t.token_ids) for t in tokenized]


def test_the_routes_serve_both_kinds(m3: Path) -> None:
    with server_client(m3, result_cache_entries=16) as c:
        sparse = c.post("/v1/embeddings", json={"input": TEXTS, "embedding_type": "sparse"}).json()
        dense = c.post("/v1/embeddings", json={"input": TEXTS}).json()
        assert all(len(d["embedding"]) == 64 for d in dense["data"])  # not the cached sparse rows
        assert dense["embedding_schema"] != sparse["embedding_schema"]
        again = c.post("/v1/embeddings", json={"input": TEXTS}).json()  # no cache mix-up of the two
        assert [d["embedding"] for d in again["data"]] == [d["embedding"] for d in dense["data"]]
        tei = c.post("/embed_sparse", json={"inputs": TEXTS}).json()
        assert [[e["index"] for e in t] for t in tei] == [d["embedding"]["indices"] for d in sparse["data"]]
        v2 = c.post("/v2/embed", json={"texts": TEXTS, "embedding_types": ["sparse"]}).json()
        indices = [d["embedding"]["indices"] for d in sparse["data"]]
        assert [e["indices"] for e in v2["embeddings"]["sparse"]] == indices
        both = c.post("/v2/embed", json={"texts": TEXTS, "embedding_types": ["float", "sparse"]}).json()
        assert both["embeddings"]["float"] == [d["embedding"] for d in dense["data"]]  # one pass, both
        assert [e["indices"] for e in both["embeddings"]["sparse"]] == indices
        every = c.post(
            "/v2/embed", json={"texts": TEXTS, "embedding_types": ["float", "sparse", "multivector"]}
        )
        multi = c.post("/v1/embeddings", json={"input": TEXTS, "embedding_type": "multivector"}).json()
        assert every.json()["embeddings"]["float"] == both["embeddings"]["float"]
        assert every.json()["embeddings"]["sparse"] == both["embeddings"]["sparse"]
        for got, want in zip(every.json()["embeddings"]["multivector"], multi["data"], strict=True):
            np.testing.assert_allclose(np.array(got), np.array(want["embedding"]), atol=1e-6)
        assert every.json()["embedding_schemas"]["multivector"] == multi["embedding_schema"]
        only = c.post("/v2/embed", json={"texts": TEXTS, "embedding_types": ["multivector"]}).json()
        assert only["embeddings"]["multivector"] == [d["embedding"] for d in multi["data"]]
        dims = c.post("/v1/embeddings", json={"input": "x", "embedding_type": "sparse", "dimensions": 8})
        assert dims.status_code == 400 and "dimensions" in dims.json()["error"]["message"]
