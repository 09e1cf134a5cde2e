"""One renderer for the engine and the gateway (#62): the `RenderSpec` a model's files give the
gateway (no weights, no torch) agrees with the one the loaded engine renders with, field by field,
for each model kind; and the gateway's count of every input kind equals the length of what the
engine prepares for it (late chunks, rerank pairs, classifier pairs, multi-vector sides,
inference-free queries), where before the gateway re-implemented each of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedserve import Engine
from embedserve.engine.ask import Ask, LateChunking
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.models.multivector_rules import TokenVectors
from embedserve.pooling.outputs import Output
from embedserve.tokenizer.spec import RenderSpec
from tests.helpers.real_text import documents
from tests.helpers.tiny_gemma import build_gemma3
from tests.helpers.tiny_multivector import build_colbert
from tests.helpers.tiny_rerankers import build_cross_encoder, build_qwen3_reranker
from tests.helpers.tiny_sparse import build_inference_free, build_splade

# Fields the files alone cannot know, or hold the same thing as another object.
_LOADED_ONLY = {"tokenizer", "max_model_len", "prompter", "static", "token_vectors", "token_dim"}
TEXTS = [d[:400] for d in documents()[:3]]
QUERIES = ["capital of france", "what is the tallest building in the world"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("render_spec")
    return {
        "decoder": qwen3_dir,
        "gemma_dense": build_gemma3(root / "gemma"),
        "cross_encoder": build_cross_encoder(root / "cross"),
        "classifier": build_cross_encoder(root / "classifier", labels=["neg", "neu", "pos"]),
        "qwen3_reranker": build_qwen3_reranker(root / "qwen3-reranker"),
        "colbert": build_colbert(root / "colbert"),
        "inference_free": build_inference_free(root / "free", build_splade(root / "splade")),
    }


@pytest.fixture(scope="module", params=["decoder", "gemma_dense", "cross_encoder", "classifier",
                                        "qwen3_reranker", "colbert", "inference_free"])  # fmt: skip
def served(
    request: pytest.FixtureRequest, models: dict[str, Path]
) -> Iterator[tuple[str, Engine, TokenCounter]]:
    path = models[request.param]
    with Engine.from_pretrained(path) as engine:
        counter = TokenCounter(path)
        counter.model_name = engine.name
        yield request.param, engine, counter


def test_the_files_spec_is_the_engines(served: tuple[str, Engine, TokenCounter]) -> None:
    kind, engine, counter = served
    loaded, files = engine.renderer.spec, counter.spec  # the counter's: RenderSpec.of_files
    for f in dataclasses.fields(RenderSpec):
        if f.name not in _LOADED_ONLY:
            assert getattr(files, f.name) == getattr(loaded, f.name), (kind, f.name)
    for name in ("prompter", "static", "token_vectors"):
        assert (getattr(files, name) is None) == (getattr(loaded, name) is None), (kind, name)
    assert loaded.limited and not files.limited
    assert files.tokenizer.vocab_size == loaded.tokenizer.vocab_size
    if kind == "colbert":  # the same rules, read without torch
        rules = [f.name for f in dataclasses.fields(TokenVectors)]
        assert [getattr(files.token_vectors, r) for r in rules] == [
            getattr(loaded.token_vectors, r) for r in rules
        ]
    if kind == "gemma_dense":
        assert files.dense_after_pooling and files.vector_size == 96
    if kind == "classifier":
        assert (files.task, files.num_labels) == ("classify", 3)


def _lengths(engine: Engine, inputs: object, ask: Ask) -> list[int]:
    return [len(t.token_ids) for t in engine.prepare(inputs, ask).tokenized]


def test_every_input_kind_counts_as_the_engine_prepares_it(served: tuple[str, Engine, TokenCounter]) -> None:
    kind, engine, counter = served
    outputs = engine.outputs
    if Output.SCORES in outputs:
        query = "what is the capital of france"
        for instruction in (None, "Find the passage"):
            ask = Ask(Output.SCORES, instruction=instruction, truncate="error")
            assert counter.count_pairs(query, TEXTS, instruction) == _lengths(engine, (query, TEXTS), ask)
    if Output.LABELS in outputs:
        items: list[str | tuple[str, str]] = [TEXTS[0], (TEXTS[1], TEXTS[2])]
        assert counter.count_classify(items) == _lengths(engine, items, Ask(Output.LABELS))
    if Output.MULTIVECTOR in outputs:
        for side, texts in (("query", QUERIES), ("document", TEXTS)):  # within each side's limit
            ask = Ask(Output.MULTIVECTOR, side=side)
            assert counter.count_multivector(texts, side, None, None) == _lengths(engine, texts, ask)
        ids = [[101, 2054, 2003, 102]]  # token ids take no side prompt (the engine's rule)
        ask = Ask(Output.MULTIVECTOR, side="query")
        assert counter.count_multivector(ids, "query", None, None) == _lengths(engine, ids, ask)
    if counter.spec.static is not None:
        prompt = counter.resolve_prompt("query", None)
        assert counter.count_static(TEXTS, prompt) == _lengths(engine, TEXTS, Ask(prompt_name="query"))
    if Output.SPANS in outputs:
        doc = TEXTS[0] + TEXTS[1]
        for document, late in [
            (TEXTS, LateChunking()),
            (doc, LateChunking(chunk_size=16)),
            (doc, LateChunking(chunk_spans=[[0, 50], [60, 200]])),
        ]:
            prompt = engine.renderer.prompt(None, None)
            plan = engine.prepare(document, Ask(Output.SPANS, late=late)).plan
            assert plan is not None
            assert counter.count_late(document, late, prompt) == len(plan.document.token_ids), kind
