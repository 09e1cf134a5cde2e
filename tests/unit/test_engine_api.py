"""The public API shows its options: every `embed*` method declares `submit`'s keyword-only
options (help() lists them), refuses unknown ones, and passes each through to the request."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve import Engine
from tests.helpers.reference import random_ids

OPTIONS = ("prompt_name", "prompt", "dimensions", "normalize", "priority", "truncate")
EMBED_METHODS = ("embed", "embed_outputs", "embed_async", "embed_outputs_async")


def _keyword_options(name: str) -> list[tuple[str, Any, Any]]:
    params = inspect.signature(getattr(Engine, name)).parameters.values()
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params), name
    return [(p.name, p.default, p.annotation) for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(qwen3_dir, max_model_len=512, max_num_batched_tokens=128) as e:
        yield e


def test_submit_documents_every_option_once() -> None:
    submit = _keyword_options("submit")
    assert [name for name, _, _ in submit] == list(OPTIONS)
    doc = inspect.getdoc(Engine.submit) or ""
    assert all(f"`{name}`" in doc for name in OPTIONS)
    for name in (*EMBED_METHODS, "submit_tokenized", "embed_tokenized_async"):
        assert "as `submit`" in (inspect.getdoc(getattr(Engine, name)) or ""), name


@pytest.mark.parametrize("name", EMBED_METHODS)
def test_embed_methods_declare_submits_options(name: str) -> None:
    assert _keyword_options(name) == _keyword_options("submit")
    assert all(f"{option}:" in str(inspect.signature(getattr(Engine, name))) for option in OPTIONS)


def test_tokenized_methods_declare_the_options_after_tokenizing() -> None:
    after = [o for o in _keyword_options("submit") if o[0] in ("dimensions", "normalize", "priority")]
    assert _keyword_options("submit_tokenized") == after
    assert _keyword_options("embed_tokenized_async") == after


@pytest.mark.parametrize("name", (*EMBED_METHODS, "submit"))
def test_an_unknown_keyword_is_a_type_error(engine: Engine, name: str) -> None:
    with pytest.raises(TypeError, match="dimension"):
        getattr(engine, name)(["a"], dimension=8)  # the coroutine functions raise at the call
    with pytest.raises(TypeError):
        getattr(engine, name)(["a"], "query")  # options are keyword-only


def test_tokenized_async_refuses_text_options(engine: Engine) -> None:
    with pytest.raises(TypeError, match="truncate"):
        engine.embed_tokenized_async(engine.tokenize(["a"]), truncate="end")  # type: ignore[call-arg]


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
        cut = await engine.embed_outputs_async([random_ids(600, seed=2)], truncate="start")
        tokenized = engine.tokenize(seqs)
        raw = await engine.embed_tokenized_async(tokenized, normalize=False)
        return short, cut, raw

    short, cut, raw = asyncio.run(main())
    assert short.shape == (1, 8)
    np.testing.assert_allclose(short[0], raw[0].embedding[:8], atol=1e-5)  # no normalization
    assert cut[0].truncated and cut[0].num_tokens == 512


def test_prompts_reach_the_tokenizer(engine: Engine) -> None:
    text = "what is rope?"
    (plain,) = engine.embed_outputs([text], prompt="")
    (query,) = engine.embed_outputs([text], prompt_name="query")
    (literal,) = engine.embed_outputs([text], prompt=engine.config.prompts["query"])
    assert query.num_tokens > plain.num_tokens
    np.testing.assert_allclose(query.embedding, literal.embedding, atol=1e-6)
    assert float(query.embedding @ plain.embedding) < 0.9999
