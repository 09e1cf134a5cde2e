"""The gateway counts exactly the tokens the engine will see (prompts and special tokens included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedserve import Engine
from embedserve.errors import InvalidInputError
from embedserve.gateway.pools.counting import TokenCounter
from tests.helpers.server_process import words

TEXTS = [words(3), "Ünïcödé ✓ text, with punctuation!", words(700, seed=2)]


def _with_default_prompt(src: Path, dst: Path) -> Path:
    """The same model, but with `default_prompt_name: query` (files linked, not copied)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "config_sentence_transformers.json":
            (dst / f.name).symlink_to(f)
    st = json.loads((src / "config_sentence_transformers.json").read_text())
    (dst / "config_sentence_transformers.json").write_text(json.dumps({**st, "default_prompt_name": "query"}))
    return dst


@pytest.mark.parametrize("default_prompt", [False, True])
def test_counts_equal_the_engines(qwen3_dir: Path, tmp_path: Path, default_prompt: bool) -> None:
    model = _with_default_prompt(qwen3_dir, tmp_path / "m") if default_prompt else qwen3_dir
    counter = TokenCounter(model)
    with Engine.from_pretrained(model, max_model_len=4096) as engine:
        for prompt_name, prompt in [(None, None), ("query", None), ("document", None), (None, "Represent: ")]:
            want = [
                len(t.token_ids)
                for t in engine.renderer.text(TEXTS, engine.renderer.prompt(prompt_name, prompt))
            ]
            got = counter.count(TEXTS, counter.resolve_prompt(prompt_name, prompt))
            assert got == want, (prompt_name, prompt)
        # Token ids are taken as the final sequence.
        assert counter.count([[1, 2, 3], [7] * 50], "") == [3, 50]
    if default_prompt:  # the default prompt really was applied
        assert counter.count(TEXTS[:1], counter.resolve_prompt(None, None)) > counter.count(TEXTS[:1], "")


def test_bad_inputs_are_named(qwen3_dir: Path) -> None:
    counter = TokenCounter(qwen3_dir)
    with pytest.raises(InvalidInputError, match="either prompt_name or prompt"):
        counter.resolve_prompt("query", "x")
    with pytest.raises(
        InvalidInputError, match="unknown prompt name 'nope'; this model defines: document, query"
    ):
        counter.resolve_prompt("nope", None)
    with pytest.raises(InvalidInputError, match="input 1: input is an empty string"):
        counter.count(["ok", ""], "")
    with pytest.raises(InvalidInputError, match="input 0: a prompt cannot be combined with token-id inputs"):
        counter.count([[1, 2]], "Query:")
    with pytest.raises(InvalidInputError, match="inputs is empty"):
        counter.count([], "")
