"""Multi-vector models on the engine against independent references: a ColBERT directory against
sentence-transformers' own MultiVectorEncoder (query expansion with and without attention,
the document skiplist, prompts); BGE-M3's colbert_linear.pt and a decoder ColBERT against the
formula on transformers' last_hidden_state; a decoder's vectors alike whole, chunked, batched,
preempted and through the layer-major lane; deterministic mode bit-identical across budgets."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.engine.loop import wait_all
from embedserve.engine.multivector import maxsim
from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.pooling.multivector import MultiVectorState
from embedserve.request import EmbedParams, Priority, Request
from tests.helpers.engine_calls import embed_multivector, submit_multivector, tokenize_multivector
from tests.helpers.preemption import preempted_vector
from tests.helpers.real_text import long_text, topic
from tests.helpers.reference import hf_model
from tests.helpers.tiny_multivector import build_colbert, build_pylate, decoder_colbert
from tests.helpers.tiny_sparse import build_bge_m3

QUERIES = ["what is python?", "How do I sort a list in place, quickly!", "x"]
DOCS = [
    "Python is a programming language, you know.",
    "list.sort() sorts the list in place; sorted() returns a new list.",
    topic("assert")[:400],
]
BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4  # one KV block of the tiny Qwen3 (as test_late_chunking's)
LONG_DOC = topic("assert")[:900]  # over the directory's document_length (180 tokens)


@pytest.fixture(scope="module")
def colbert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_colbert(tmp_path_factory.mktemp("colbert") / "c")


def _reference(path: Path, texts: list[str], side: str) -> list[np.ndarray]:
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(path), device="cpu")
    encode = model.encode_query if side == "query" else model.encode_document
    return [v.numpy() for v in encode(texts)]


@pytest.mark.parametrize("attend", [False, True])
def test_colbert_equals_sentence_transformers(tmp_path: Path, attend: bool) -> None:
    path = build_colbert(tmp_path / "c", attend=attend)
    with Engine.from_pretrained(path) as engine:
        queries = embed_multivector(engine, QUERIES, input_type="query")
        docs = embed_multivector(engine, DOCS)  # documents by default
        alone = embed_multivector(engine, DOCS[1])[0]
        items = tokenize_multivector(engine, DOCS, "document")
        with pytest.raises(InputTooLongError, match="180"):  # never cut silently
            embed_multivector(engine, LONG_DOC)
        cut = embed_multivector(engine, LONG_DOC, truncate="end")  # as sentence-transformers cuts it
    got_all = queries + docs + cut
    want_all = _reference(path, QUERIES, "query") + _reference(path, [*DOCS, LONG_DOC], "document")
    for got, want in zip(got_all, want_all, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert all(q.shape == (32, 128) for q in queries)  # expanded to the query length
    np.testing.assert_allclose(alone, docs[1], atol=1e-6)  # batched as alone
    # the skiplist: punctuation gives no document vector
    punct = {engine.tokenizer.backend.token_to_id(c) for c in string.punctuation} - {None}
    kept = [t for t, k in zip(items[1].tokenized.token_ids, items[1].keep, strict=True) if k]
    assert docs[1].shape[0] == len(kept) and not punct & set(kept)
    assert len(items[1].tokenized.token_ids) > len(kept)


def test_a_normalize_of_the_pooled_vector_leaves_token_vectors_unnormalized(tmp_path: Path) -> None:
    """Each module acts on its module_input_name: a Normalize of "sentence_embedding" in a
    multi-vector directory changes none of its token vectors (sentence-transformers' own)."""
    path = build_colbert(tmp_path / "c")
    (path / "3_Normalize" / "config.json").write_text(json.dumps({"module_input_name": "sentence_embedding"}))
    with Engine.from_pretrained(path) as engine:
        got = embed_multivector(engine, QUERIES, input_type="query") + embed_multivector(engine, DOCS)
    want = _reference(path, QUERIES, "query") + _reference(path, DOCS, "document")
    norms = np.concatenate([np.linalg.norm(g, axis=1) for g in got])
    assert np.abs(norms - 1).max() > 0.1  # not normalized, as the reference
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_pylate_v3_directory_equals_sentence_transformers(tmp_path: Path) -> None:
    """PyLate v3's save: prefixes inserted as one token each ("[unused0]" is in the vocabulary
    but splits into four pieces as text), the punctuation skiplist and normalization implied."""
    path = build_pylate(tmp_path / "p")
    with Engine.from_pretrained(path) as engine:
        got = embed_multivector(engine, QUERIES, input_type="query") + embed_multivector(engine, DOCS)
        ids = engine.renderer.text("what", engine.config.prompts["query"])[0].token_ids
    assert ids[:2] == [101, 1]  # [CLS] [unused0]
    want = _reference(path, QUERIES, "query") + _reference(path, DOCS, "document")
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_attending_to_the_expansion_changes_the_real_rows(colbert: Path, tmp_path: Path) -> None:
    """attend false: the expansion positions are never keys (the real tokens' rows are those of
    the query alone); attend true: they are, and every row changes."""
    with Engine.from_pretrained(colbert) as engine:
        plain = embed_multivector(engine, QUERIES[0], input_type="query")[0]
        n = len(engine.renderer.text(QUERIES[0], "[unused0] ")[0].token_ids)
        unexpanded = embed_multivector(engine, QUERIES[0], input_type="document", prompt="[unused0] ")[0]
        keep = tokenize_multivector(engine, QUERIES[0], "document", prompt="[unused0] ")[0].keep
    with Engine.from_pretrained(build_colbert(tmp_path / "a", attend=True)) as engine:
        attended = embed_multivector(engine, QUERIES[0], input_type="query")[0]
    assert n == len(keep) < 32 and not all(keep)  # "[", "]" and "?" are in the document skiplist
    np.testing.assert_allclose(plain[:n][np.array(keep)], unexpanded, atol=1e-5)
    assert not np.allclose(plain[:n], attended[:n], atol=1e-3)


def test_query_limits_dimensions_and_refusals(colbert: Path) -> None:
    long_query = " ".join(["word"] * 40)
    with Engine.from_pretrained(colbert) as engine:
        with pytest.raises(InputTooLongError):
            embed_multivector(engine, long_query, input_type="query")
        cut = embed_multivector(engine, long_query, input_type="query", truncate="end")[0]
        assert cut.shape == (32, 128)
        small = embed_multivector(engine, DOCS[0], dimensions=16)[0]
        full = embed_multivector(engine, DOCS[0])[0]
        ref = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
        np.testing.assert_allclose(small, ref, atol=1e-6)
        raw = embed_multivector(engine, DOCS[0], normalize=False)[0]
        assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
        for bad in (0, 129):
            with pytest.raises(InvalidInputError, match="dimensions"):
                embed_multivector(engine, DOCS[0], dimensions=bad)
        with pytest.raises(InvalidInputError, match="input_type"):
            tokenize_multivector(engine, DOCS[0], "passage")
        assert embed_multivector(engine, DOCS[0])[0].shape == full.shape  # still serving


def test_a_colbert_model_has_no_single_vectors(colbert: Path) -> None:
    with Engine.from_pretrained(colbert) as engine:
        with pytest.raises(InvalidInputError, match="multi-vector"):
            engine.embed(DOCS[0])
        head = engine.multivector_head
        assert head is not None and head.only
        # sentence-transformers' document prompt names, in its order; token ids take no side prompt
        assert head.side_prompt("document", None, None, {"passage": "p", "corpus": "c"}) == "passage"
        ids = engine.renderer.text(DOCS[0], "")[0].token_ids
        assert tokenize_multivector(engine, [ids], "document")[0].tokenized.token_ids == ids


def test_a_single_vector_model_refuses_multivector(qwen3_dir: Path) -> None:
    with Engine.from_pretrained(qwen3_dir) as engine:
        assert engine.multivector_head is None
        with pytest.raises(InvalidInputError, match="one vector per input"):
            embed_multivector(engine, "hello")


def test_bge_m3_multivectors_equal_the_formula(tmp_path: Path) -> None:
    """FlagEmbedding's colbert vectors: colbert_linear(last_hidden_state[1:]) normalized."""
    path = build_bge_m3(tmp_path / "m3")
    state = torch.load(path / "colbert_linear.pt", weights_only=True)
    with Engine.from_pretrained(path) as engine:
        got = embed_multivector(engine, DOCS)
        ids = [t.token_ids for t in engine.renderer.text(DOCS)]
        dense = engine.embed(DOCS)  # its single vectors still serve
    assert dense.shape == (3, 64)
    with torch.inference_mode():
        for vecs, seq in zip(got, ids, strict=True):
            hidden = hf_model(str(path))(input_ids=torch.tensor([seq])).last_hidden_state[0].float()
            want = torch.nn.functional.normalize(hidden[1:] @ state["weight"].T + state["bias"], dim=-1)
            assert vecs.shape == (len(seq) - 1, 64)
            np.testing.assert_allclose(vecs, want.numpy(), atol=1e-5)


def _dense_formula(path: Path, rows: torch.Tensor) -> np.ndarray:
    """A decoder ColBERT's vectors from its kept rows: Dense, then normalized."""
    from safetensors.torch import load_file

    dense = load_file(str(path / "1_Dense" / "model.safetensors"))
    out = rows @ dense["linear.weight"].T + dense["linear.bias"]
    return torch.nn.functional.normalize(out, dim=-1).numpy()


def _decoder_reference(path: Path, ids: list[int], keep: list[bool]) -> np.ndarray:
    with torch.inference_mode():
        hidden = hf_model(str(path))(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
        return _dense_formula(path, hidden[torch.tensor(keep)])


def test_decoder_multivectors_whole_chunked_and_through_the_lane(qwen3_dir: Path, tmp_path: Path) -> None:
    path = decoder_colbert(qwen3_dir, tmp_path / "dc")
    texts = [long_text(1500), "Short, with punctuation: yes!"]
    with Engine.from_pretrained(path) as engine:
        whole = embed_multivector(engine, texts)
        items = tokenize_multivector(engine, texts, "document")
        query = embed_multivector(engine, "what is assert?", input_type="query")[0]
        n_query = len(engine.renderer.text("what is assert?", "Query: ")[0].token_ids)
    for vecs, item in zip(whole, items, strict=True):
        want = _decoder_reference(path, item.tokenized.token_ids, item.keep)
        np.testing.assert_allclose(vecs, want, atol=1e-5)
    assert query.shape[0] == n_query  # the query side: no skiplist, the "query" prompt
    # chunked prefill cutting the long text mid-way (48 tokens a step), and the layer-major lane
    for opts in ({"max_num_batched_tokens": 48}, {"layer_major_tokens": 256, "max_num_batched_tokens": 64}):
        with Engine.from_pretrained(path, **opts) as engine:
            done = wait_all(submit_multivector(engine, tokenize_multivector(engine, texts, "document")))
        got = [f.vector.numpy() for f in done if f.vector is not None]
        runs = done[0].request.num_lane_slices if "layer_major_tokens" in opts else done[0].request.num_steps
        assert runs > 5  # the long text ran in many steps (chunks), or through the lane
        for a, b in zip(got, whole, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert maxsim(query, whole[0]) > 0


def test_preemption_mid_document_changes_nothing(qwen3_dir: Path, tmp_path: Path) -> None:
    path = decoder_colbert(qwen3_dir, tmp_path / "dc")
    with Engine.from_pretrained(path) as engine:
        item = tokenize_multivector(engine, long_text(5000)[:5500], "document")[0]
        alone = embed_multivector(engine, long_text(5000)[:5500])[0]
        head = engine.multivector_head
    assert head is not None and 1000 < len(item.tokenized.token_ids) <= 1440
    core = build_engine(
        path, max_num_batched_tokens=128, kv_cache_memory=90 * BLOCK_BYTES, layer_major_tokens=0
    ).core
    doc = Request(
        0, item.tokenized.token_ids, EmbedParams(normalize=False), PoolingMethod.MEAN, Priority.BATCH
    )
    doc.pooling = MultiVectorState(head, item.keep, None, None, True)
    np.testing.assert_allclose(preempted_vector(core, doc), alone, atol=1e-5)


def test_decoder_multivectors_are_bit_identical_across_budgets_when_deterministic(
    qwen3_dir: Path, tmp_path: Path
) -> None:
    path = decoder_colbert(qwen3_dir, tmp_path / "dc")
    texts = [long_text(3000), "short one"]
    outs = []
    for budget, lane in ((256, 0), (1024, 0), (512, 300)):
        with Engine.from_pretrained(
            path, deterministic=True, max_num_batched_tokens=budget, layer_major_tokens=lane
        ) as engine:
            outs.append(embed_multivector(engine, texts))
    for other in outs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(outs[0], other, strict=True))


def test_a_vision_language_model_with_a_dense_head_gives_text_and_image_token_vectors(
    qwen3_vl_dir: Path, tmp_path: Path
) -> None:
    """ColQwen-style: Qwen3-VL + Dense. Every position of the chat-formatted input, image tokens
    included, gives a vector: the formula on transformers' last_hidden_state (images through its
    own processor)."""
    from embedserve.embedders.vl import VLReference
    from tests.helpers.tiny_vl import image

    path = decoder_colbert(qwen3_vl_dir, tmp_path / "colqwen", dim=32)
    pictures = [image(200, 150, seed=1), image(64, 96, seed=2)]
    inputs = [["The chart below: ", pictures[0], " shows revenue."], [pictures[1]], ["text only, here."]]
    with Engine.from_pretrained(path, max_num_batched_tokens=64) as engine:  # chunks cut around images
        got = embed_multivector(engine, inputs)
        items = tokenize_multivector(engine, inputs, "document")
    ref = VLReference(path)
    for vecs, item, parts in zip(got, items, inputs, strict=True):
        images = [p for p in parts if not isinstance(p, str)]
        kwargs = ref.image_inputs(images) if images else {}
        hidden = ref.hidden_rows(torch.tensor([item.tokenized.token_ids]), kwargs)
        want = _dense_formula(path, hidden[torch.tensor(item.keep)])
        assert vecs.shape == want.shape and vecs.shape[0] > (20 if images else 5)
        np.testing.assert_allclose(vecs, want, atol=1e-5)
