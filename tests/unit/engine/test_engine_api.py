"""The public API shows its options: `Ask` declares every option once (help() lists them),
`embed` / `embed_async` declare the same keyword-only options with the same defaults, unknown
ones are refused, and each reaches the request."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve import Engine
from embedserve.engine.ask import Ask
from tests.helpers.engine_calls import embed_outputs, embed_outputs_async, embed_tokenized_async
from tests.helpers.reference import random_ids

OPTIONS = ("prompt_name", "prompt", "dimensions", "normalize", "priority", "truncate")
EMBED_METHODS = ("embed", "embed_async")


def _keyword_options(name: str) -> list[tuple[str, Any]]:
    params = inspect.signature(getattr(Engine, name)).parameters.values()
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params), name
    return [(p.name, p.default) for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(qwen3_dir, max_model_len=512, max_num_batched_tokens=128) as e:
        yield e


def test_ask_documents_every_option_once() -> None:
    fields = [f.name for f in dataclasses.fields(Ask)]
    assert fields[1 : 1 + len(OPTIONS)] == list(OPTIONS)
    doc = inspect.getdoc(Ask) or ""
    assert all(f"`{name}`" in doc for name in OPTIONS)
    for name in EMBED_METHODS:
        assert "as `Ask`'s" in (inspect.getdoc(getattr(Engine, name)) or ""), name


def test_the_engine_has_one_path_and_few_public_names() -> None:
    """Every output goes prepare -> submit -> run with an Ask; what is public stays small (#62)."""
    public = sorted(n for n in dir(Engine) if not n.startswith("_"))
    assert len(public) <= 15, public
    assert {"prepare", "submit", "run", "run_async"} <= set(public)


@pytest.mark.parametrize("name", EMBED_METHODS)
def test_embed_methods_declare_the_asks_options(name: str) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(Ask)}
    assert _keyword_options(name) == [(o, defaults[o]) for o in OPTIONS]


@pytest.mark.parametrize("name", EMBED_METHODS)
def test_an_unknown_keyword_is_a_type_error(engine: Engine, name: str) -> None:
    with pytest.raises(TypeError, match="dimension"):
        getattr(engine, name)(["a"], dimension=8)  # the coroutine functions raise at the call
    with pytest.raises(TypeError):
        getattr(engine, name)(["a"], "query")  # options are keyword-only
    with pytest.raises(TypeError, match="dimension"):
        Ask(dimension=8)  # type: ignore[call-arg]


def test_prepared_inputs_run_as_prepared(engine: Engine) -> None:
    """A Prepared's tokens run as they are: its ask's text options (prompt, truncation) were
    applied when it was made, not again."""
    prepared = engine.prepare(["a b c"], Ask(prompt="Query: "))
    again = engine.run(prepared, Ask(prompt="other: "))  # the prepared ask wins
    assert again[0].num_tokens == len(prepared.tokenized[0].token_ids)  # type: ignore[union-attr]
    np.testing.assert_allclose(again[0].embedding, engine.embed(["a b c"], prompt="Query: ")[0], atol=1e-6)  # type: ignore[union-attr]


def test_dimensions_and_normalize_reach_the_request(engine: Engine) -> None:
    seqs = [random_ids(n, seed=n) for n in (5, 60)]
    full = engine.embed(seqs)
    raw = engine.embed(seqs, normalize=False)
    assert np.allclose(np.linalg.norm(full, axis=1), 1, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-3)
    np.testing.assert_allclose(full, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)
    short = engine.embed(seqs, dimensions=16)
    want = raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1, keepdims=True)  # slice, then normalize
    assert short.shape == (2, 16)
    np.testing.assert_allclose(short, want, atol=1e-5)


def test_async_methods_pass_their_options(engine: Engine) -> None:
    seqs = [random_ids(30, seed=1)]

    async def main() -> tuple[np.ndarray, list[Any], list[Any]]:
        short = await engine.embed_async(seqs, dimensions=8, normalize=False, priority="batch")
        cut = await embed_outputs_async(engine, [random_ids(600, seed=2)], truncate="start")
        tokenized = engine.renderer.text(seqs)
        raw = await embed_tokenized_async(engine, tokenized, normalize=False)
        return short, cut, raw

    short, cut, raw = asyncio.run(main())
    assert short.shape == (1, 8)
    np.testing.assert_allclose(short[0], raw[0].embedding[:8], atol=1e-5)  # no normalization
    assert cut[0].truncated and cut[0].num_tokens == 512


def test_prompts_reach_the_tokenizer(engine: Engine) -> None:
    text = "what is rope?"
    (plain,) = embed_outputs(engine, [text], prompt="")
    (query,) = embed_outputs(engine, [text], prompt_name="query")
    (literal,) = embed_outputs(engine, [text], prompt=engine.config.prompts["query"])
    assert query.num_tokens > plain.num_tokens
    np.testing.assert_allclose(query.embedding, literal.embedding, atol=1e-6)
    assert float(query.embedding @ plain.embedding) < 0.9999
