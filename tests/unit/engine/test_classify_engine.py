"""Sequence classification vs transformers (fp32, 1e-5): AutoModelForSequenceClassification +
softmax for 3-label BERT / XLM-R classifiers, + sigmoid for a multi-label one; labels from
id2label. Plus: text pairs, the async and tokenized paths, batched == alone, truncation, a
1-label classifier's classify == its rerank score, the task resolution and its refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from embedserve import Engine
from embedserve.engine.ask import Ask, answers_as
from embedserve.engine.classify import ClassifyResult
from embedserve.engine.options import EngineOptions
from embedserve.engine.resolve import resolve
from embedserve.errors import InputTooLongError, InvalidInputError, ModelLoadError
from embedserve.models.open import open_model
from embedserve.models.registry import CLASSIFIER, model_config_from_hf
from embedserve.models.score_head import load_score_head
from embedserve.pooling.outputs import Output
from tests.helpers.real_text import documents
from tests.helpers.tiny_bert import build_encoder
from tests.helpers.tiny_rerankers import build_cross_encoder

LABELS = ["negative", "neutral", "positive"]
TOPICS = ["emotions", "sports", "finance", "weather"]
LENGTHS = [10, 25, 40, 60, 90, 120, 160, 200, 260, 320, 400, 500, 650, 800, 1000, 1200]  # characters
# 20 texts from one word to a few hundred tokens
TEXTS = ["ok", "lift", "the wing stalls", "Is this a question?"] + [
    doc[:n] for doc, n in zip(documents(), LENGTHS, strict=False)
]
PAIRS = [("how do wings produce lift", "pressure differences"), ("a", "b " * 30), ("short", TEXTS[-1])]


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def clf_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("clf") / request.param, request.param, labels=LABELS)


@pytest.fixture(scope="module")
def multi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("multi") / "bert"
    return build_cross_encoder(dst, seed=1, labels=TOPICS, problem_type="multi_label_classification")


@pytest.fixture(scope="module")
def clf_engine(clf_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(clf_dir, max_num_batched_tokens=1024) as e:
        yield e


def _reference(path: Path, inputs: list[str] | list[tuple[str, str]]) -> tuple[torch.Tensor, list[int]]:
    """transformers' logits [n, labels] one input at a time (no padding), and token counts."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    rows, counts = [], []
    for item in inputs:
        enc = tok(*item, return_tensors="pt") if isinstance(item, tuple) else tok(item, return_tensors="pt")
        with torch.no_grad():
            rows.append(model(**enc).logits[0])
        counts.append(int(enc["input_ids"].shape[1]))
    return torch.stack(rows), counts


def _probs(results: list[ClassifyResult]) -> torch.Tensor:
    return torch.tensor([r.probs for r in results], dtype=torch.float64)


def test_single_label_probs_match_transformers_softmax(clf_dir: Path, clf_engine: Engine) -> None:
    assert clf_engine.config.task == "classify"
    logits, counts = _reference(clf_dir, TEXTS)
    results = clf_engine.classify(TEXTS)
    ref = torch.softmax(logits, dim=-1).double()
    assert (_probs(results) - ref).abs().max() < 1e-5
    assert [r.label for r in results] == [LABELS[int(i)] for i in ref.argmax(-1)]
    assert {r.num_classes for r in results} == {3}
    assert [r.num_tokens for r in results] == counts
    assert not any(r.truncated for r in results)
    raw = clf_engine.classify(TEXTS, raw_scores=True)
    assert (_probs(raw) - logits.double()).abs().max() < 1e-5


def test_multi_label_probs_match_transformers_sigmoid(multi_dir: Path) -> None:
    logits, _ = _reference(multi_dir, TEXTS)
    with Engine.from_pretrained(multi_dir, max_num_batched_tokens=1024) as e:
        assert e.config.task == "classify"
        results = e.classify(TEXTS)
    ref = torch.sigmoid(logits).double()
    assert (_probs(results) - ref).abs().max() < 1e-5
    assert [r.label for r in results] == [TOPICS[int(i)] for i in ref.argmax(-1)]
    assert {r.num_classes for r in results} == {4}
    assert max(abs(sum(r.probs) - 1) for r in results) > 1e-2  # not a softmax


def test_text_pairs_match_transformers(clf_dir: Path, clf_engine: Engine) -> None:
    logits, counts = _reference(clf_dir, PAIRS)
    results = clf_engine.classify([list(p) if i % 2 else p for i, p in enumerate(PAIRS)])  # tuple or list
    assert (_probs(results) - torch.softmax(logits, dim=-1).double()).abs().max() < 1e-5
    assert [r.num_tokens for r in results] == counts


def test_async_and_tokenized_paths_equal_the_sync_one(clf_engine: Engine) -> None:
    sync = clf_engine.classify(TEXTS[:6])

    async def both() -> tuple[list[ClassifyResult], list[ClassifyResult]]:
        prepared = clf_engine.prepare(TEXTS[:6], Ask(Output.LABELS))
        return (
            answers_as(
                await clf_engine.run_async(TEXTS[:6], Ask(Output.LABELS, priority="batch")), ClassifyResult
            ),
            answers_as(await clf_engine.run_async(prepared), ClassifyResult),
        )

    for other in asyncio.run(both()):
        assert [r.label for r in other] == [r.label for r in sync]
        assert (_probs(other) - _probs(sync)).abs().max() < 1e-6
        assert all(r.queue_time >= 0 and r.inference_time >= 0 for r in other)


def test_batched_equals_alone(clf_engine: Engine) -> None:
    together = clf_engine.classify(TEXTS)
    for text, r in zip(TEXTS[::4], together[::4], strict=True):
        (alone,) = clf_engine.classify(text)
        assert alone.label == r.label
        assert max(abs(a - b) for a, b in zip(alone.probs, r.probs, strict=True)) < 1e-6


def test_truncation_as_asked(clf_dir: Path) -> None:
    long_text = "lift and drag of a wing " * 40  # ~200 tokens > 64
    with Engine.from_pretrained(clf_dir, max_model_len=64, max_num_batched_tokens=64) as e:
        with pytest.raises(InputTooLongError):
            e.classify(["fine", long_text])  # "error" by default
        for how in ("end", "start"):
            (res,) = e.classify([long_text], truncate=how)
            assert res.truncated and res.num_tokens == 64
        (tok,) = e.renderer.classify([("a question", long_text)], truncate="end")
        assert tok.truncated and len(tok.token_ids) == 64


@pytest.mark.parametrize("inputs", [[], [""], ["ok", None], [1.5], [["a", 2.5]], [("", "b")], [[]]])
def test_bad_inputs(clf_engine: Engine, inputs: list[object]) -> None:
    with pytest.raises(InvalidInputError):
        clf_engine.classify(inputs)


def test_one_label_classifier_reranks_and_classifies_alike(tmp_path: Path) -> None:
    path = build_cross_encoder(tmp_path / "ce")
    assert resolve(EngineOptions(), open_model(path)).task == "rerank"  # auto: as before
    docs = ["pressure differences", "boundary layers", "lift " * 20]
    with Engine.from_pretrained(path, task="classify", max_num_batched_tokens=1024) as e:
        assert e.config.task == "classify"
        classified = e.classify([("how do wings produce lift", d) for d in docs])
        scores = {r.index: r.relevance_score for r in e.rerank("how do wings produce lift", docs)}
    assert [r.num_classes for r in classified] == [1, 1, 1]
    assert max(abs(r.probs[0] - scores[i]) for i, r in enumerate(classified)) < 1e-6


def test_resolve_refusals(clf_dir: Path, tmp_path: Path) -> None:
    files = open_model(clf_dir)
    assert files.model.labels == tuple(LABELS) and files.model.problem_type is None
    assert resolve(EngineOptions(task="classify"), files).task == "classify"
    assert resolve(EngineOptions(task="embed"), files).task == "embed"
    with pytest.raises(ModelLoadError, match=r"3 labels.*task classify"):
        resolve(EngineOptions(task="rerank"), files)
    embedder = open_model(build_encoder(tmp_path / "enc"))
    with pytest.raises(ModelLoadError, match="not a classifier"):
        resolve(EngineOptions(task="classify"), embedder)


def test_wrong_task_calls_are_refused(clf_engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="3 labels: it cannot rerank"):
        clf_engine.rerank("query", ["doc"])
    with (
        Engine.from_pretrained(build_encoder(tmp_path / "enc")) as e,
        pytest.raises(InvalidInputError, match="embedding model: it cannot classify"),
    ):
        e.classify(["text"])


def test_labels_as_transformers_reads_them() -> None:
    raw = {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": 100,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
    }
    assert model_config_from_hf(raw).labels == ("LABEL_0", "LABEL_1")  # transformers' default
    assert model_config_from_hf({**raw, "num_labels": 3}).labels == ("LABEL_0", "LABEL_1", "LABEL_2")
    named = model_config_from_hf({**raw, "id2label": {"1": "b", "0": "a"}, "problem_type": "regression"})
    assert named.labels == ("a", "b") and named.problem_type == "regression"
    assert model_config_from_hf({**raw, "architectures": ["BertModel"]}).labels == ()


def test_head_refuses_labels_the_weights_do_not_have() -> None:
    model = model_config_from_hf(
        {
            "architectures": ["BertForSequenceClassification"],
            "model_type": "bert",
            "vocab_size": 100,
            "hidden_size": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 16,
        }
    )  # two labels
    weights = [("classifier.weight", torch.zeros(3, 8)), ("bert.pooler.dense.weight", torch.zeros(8, 8))]
    with pytest.raises(ModelLoadError, match="2 labels but the classifier has 3"):
        load_score_head(CLASSIFIER, weights, model=model)
    head = load_score_head(CLASSIFIER, weights)  # no config: labels named by id
    assert head.labels == ("LABEL_0", "LABEL_1", "LABEL_2")
    assert torch.allclose(head.probs(torch.zeros(1, 8)), torch.full((1, 3), 1 / 3))
