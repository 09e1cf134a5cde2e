"""`embedserve embed`: vectors as JSON, and errors worded for the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedserve import Engine
from embedserve.cli import main
from tests.helpers.tiny_bert import minilm_dir


def test_embed_prints_the_engines_vectors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["embed", "--model", str(minilm_dir()), "hello world", "a second text"]) == 0
    printed = np.array(json.loads(capsys.readouterr().out))
    with Engine.from_pretrained(minilm_dir()) as engine:
        expected = engine.embed(["hello world", "a second text"])
    assert printed.shape == expected.shape
    assert np.abs(printed - expected).max() < 1e-6  # rounded to 7 decimals


def test_too_long_input_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    long_text = "word " * 400
    assert main(["embed", "--model", str(minilm_dir()), "short", long_text]) == 2
    err = capsys.readouterr().err
    assert "input 1: 402 tokens exceed the limit of 256 tokens" in err
    assert "pass --truncate end / start" in err and "truncate='end'" not in err
    assert main(["embed", "--model", str(minilm_dir()), "--truncate", "end", long_text]) == 0
