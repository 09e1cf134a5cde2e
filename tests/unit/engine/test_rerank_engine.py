"""Reranker scores vs the references (fp32, 1e-5): sentence-transformers CrossEncoder.predict
for BERT / XLM-R cross-encoders, transformers for a Qwen3-Reranker-style causal LM (yes / no
logits of the last token). Plus: batched == alone, chunked long documents, bad inputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.errors import InvalidInputError
from embedserve.tokenizer.pairs import QWEN3_INSTRUCTION, QWEN3_PREFIX, QWEN3_SUFFIX
from tests.helpers.tiny_rerankers import build_cross_encoder, build_qwen3_reranker

QUERY = "how do wings produce lift"
DOCS = [
    "the pressure difference between the upper and lower surface of an airfoil",
    "boundary layers",
    "a theory of supersonic flow past slender bodies with shock waves and expansions " * 3,
    "lift",
]


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def cross_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / request.param, request.param)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_reranker(tmp_path_factory.mktemp("qr") / "tiny-Qwen3-Reranker")


@pytest.fixture(scope="module")
def cross_engine(cross_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(cross_dir, max_num_batched_tokens=1024) as e:
        yield e


def test_cross_encoder_scores_match_crossencoder_predict(cross_dir: Path, cross_engine: Engine) -> None:
    from sentence_transformers import CrossEncoder

    ref = CrossEncoder(str(cross_dir), device="cpu").predict([(QUERY, d) for d in DOCS])
    results = cross_engine.rerank(QUERY, DOCS)
    ours = np.array([r.relevance_score for r in sorted(results, key=lambda r: r.index)])
    assert np.abs(ours - np.asarray(ref)).max() < 1e-5
    assert [r.index for r in results] == list(np.argsort(-np.asarray(ref), kind="stable"))
    raw = cross_engine.rerank(QUERY, DOCS, raw_scores=True, top_n=2)
    assert (
        len(raw) == 2 and abs(1 / (1 + np.exp(-raw[0].relevance_score)) - results[0].relevance_score) < 1e-6
    )


def test_cross_encoder_truncates_the_document_not_the_query(cross_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    long_doc = "lift and drag of a wing " * 40  # ~200 tokens > 64
    with Engine.from_pretrained(cross_dir, max_model_len=64, max_num_batched_tokens=64) as e:
        res = e.rerank(QUERY, [long_doc])
        assert res[0].truncated and res[0].num_tokens == 64
        with pytest.raises(InvalidInputError):
            e.rerank(QUERY, [long_doc], truncate="error")
    ref = CrossEncoder(str(cross_dir), device="cpu", max_length=64).predict([(QUERY, long_doc)])
    assert abs(res[0].relevance_score - float(ref[0])) < 1e-5


def test_a_query_of_spaces_is_scored_as_cross_encoder_scores_it(cross_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    with Engine.from_pretrained(cross_dir) as e:
        got = {r.index: r.relevance_score for r in e.rerank("  ", DOCS)}
    ref = CrossEncoder(str(cross_dir), device="cpu").predict([("  ", d) for d in DOCS])
    assert max(abs(got[i] - float(ref[i])) for i in range(len(DOCS))) < 1e-5


def test_batched_equals_alone(cross_engine: Engine) -> None:
    together = {r.index: r.relevance_score for r in cross_engine.rerank(QUERY, DOCS)}
    for i, d in enumerate(DOCS):
        assert abs(cross_engine.rerank(QUERY, [d])[0].relevance_score - together[i]) < 1e-6


@pytest.mark.parametrize(
    ("query", "docs", "top_n"),
    # an empty text is refused; spaces are a text, as the tokenizer and CrossEncoder take them
    [(QUERY, [], None), ("", DOCS, None), (QUERY, DOCS, 0), (QUERY, ["ok", ""], None)],
)
def test_bad_rerank_inputs(cross_engine: Engine, query: str, docs: list[str], top_n: int | None) -> None:
    with pytest.raises(InvalidInputError):
        cross_engine.rerank(query, docs, top_n=top_n)


def _qwen_reference(path: Path, query: str, docs: list[str]) -> np.ndarray:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)
    out = []
    for d in docs:  # the model card's recipe, one pair at a time (no padding)
        text = f"<Instruct>: {QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {d}"
        ids = prefix + tok.encode(text, add_special_tokens=False) + suffix
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        out.append(torch.softmax(torch.stack([logits[yes], logits[no]]), 0)[0].item())
    return np.array(out)


def test_qwen3_reranker_matches_transformers_and_chunks_long_documents(qwen_dir: Path) -> None:
    long_doc = "Wings produce lift because air flows faster over the curved upper surface. " * 60
    docs = [*DOCS, long_doc]  # ~900 tokens: 8+ chunks of 100
    ref = _qwen_reference(qwen_dir, QUERY, docs)
    with Engine.from_pretrained(qwen_dir, max_num_batched_tokens=100, layer_major_tokens=0) as e:
        assert e.config.task == "rerank"
        res = e.rerank(QUERY, docs)
        ours = np.array([r.relevance_score for r in sorted(res, key=lambda r: r.index)])
        assert res[-1].num_tokens > 800 or any(r.num_tokens > 800 for r in res)
        alone = e.rerank(QUERY, [long_doc])[0].relevance_score
    assert np.abs(ours - ref).max() < 1e-5
    assert abs(alone - ours[-1]) < 1e-6


def test_an_embedding_model_refuses_to_rerank(qwen3_dir: Path) -> None:
    with Engine.from_pretrained(qwen3_dir, max_model_len=256) as e:
        assert e.config.task == "embed"
        with pytest.raises(InvalidInputError, match="embedding model"):
            e.rerank(QUERY, DOCS)


def test_qwen3_reranker_cuts_only_the_document(qwen_dir: Path) -> None:
    long_doc = "lift and drag of a swept wing " * 100
    with Engine.from_pretrained(qwen_dir, max_model_len=160, max_num_batched_tokens=64) as e:
        for how in ("end", "start"):
            (tok,) = e.renderer.pairs(QUERY, [long_doc], truncate=how)
            text = e.tokenizer.backend.decode(tok.token_ids)
            assert tok.truncated and len(tok.token_ids) == 160
            assert f"<Query>: {QUERY}\n<Document>:" in text and text.endswith("</think>\n\n")
        with pytest.raises(InvalidInputError):
            e.rerank(QUERY, [long_doc], truncate="error")
        assert e.rerank(QUERY, [long_doc])[0].truncated
