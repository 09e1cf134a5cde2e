"""Token-based chunking: limits in the model's tokenizer, coverage, boundaries, overlap."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from embedserve.errors import InvalidInputError
from embedserve.index.chunking import Chunker
from embedserve.index.embedder import load_tokenizer
from embedserve.tokenizer import Tokenizer
from tests.helpers.real_text import topic


@pytest.fixture(scope="module")
def tok(qwen3_dir: Path) -> Tokenizer:
    return load_tokenizer(qwen3_dir)  # appends <|endoftext|>: one special token per sequence


def _model_len(tok: Tokenizer, text: str) -> int:
    return len(tok.backend.encode(text).ids)  # with the post-processor, as the engine counts


def _words(text: str) -> list[str]:
    return re.findall(r"\S+", text)


def test_chunks_fit_the_limit_and_cover_the_text_in_order(tok: Tokenizer) -> None:
    text = topic("compound")  # ~14K characters of prose and grammar rules
    chunks = Chunker(tok, 96, 0).split(text)
    assert len(chunks) > 20
    assert max(_model_len(tok, c.text) for c in chunks) <= 96
    # Without overlap the chunks tile the text: only whitespace lies between them.
    assert chunks[0].start == len(text) - len(text.lstrip())
    for a, b in itertools.pairwise(chunks):
        assert a.end <= b.start and text[a.end : b.start].strip() == ""
    assert chunks[-1].end == len(text.rstrip())
    assert _words(" ".join(c.text for c in chunks)) == _words(text)
    for c in chunks:
        assert text[c.start : c.end] == c.text


def test_overlap_repeats_at_most_the_overlap(tok: Tokenizer) -> None:
    text = topic("assert") * 3
    chunks = Chunker(tok, 64, 12).split(text)
    for a, b in itertools.pairwise(chunks):
        assert b.start < a.end, "consecutive chunks must share text"
        shared = text[b.start : a.end]
        assert len(tok.backend.encode(shared, add_special_tokens=False).ids) <= 12 + 1
        assert b.start > a.start


def test_cuts_prefer_paragraphs_then_sentences(tok: Tokenizer) -> None:
    para = "Short words here. " * 6  # ~24 tokens, sentence ends every 4 tokens
    text = "\n\n".join([para.strip()] * 6)
    chunks = Chunker(tok, 64, 0).split(text)
    # Two paragraphs (~50 tokens) fit a 63-token budget: every cut lands on a paragraph break.
    for c in chunks:
        assert c.text.startswith("Short") and c.text.endswith("here.")
        assert text[c.end : c.end + 2] in ("\n\n", "")
    sentences = "One two three four five six seven eight nine ten. " * 30
    for c in Chunker(tok, 40, 0).split(sentences):
        assert c.text.endswith("ten."), c.text


def test_a_single_long_word_is_cut_inside_it(tok: Tokenizer) -> None:
    text = "x" * 5000
    chunks = Chunker(tok, 32, 0).split(text)
    assert "".join(c.text for c in chunks) == text
    assert max(_model_len(tok, c.text) for c in chunks) <= 32


def test_whitespace_only_text_has_no_chunks(tok: Tokenizer) -> None:
    assert Chunker(tok, 32, 0).split(" \n\n \t ") == []


@pytest.mark.parametrize(("max_tokens", "overlap"), [(1, 0), (2, 0), (64, 32), (64, -1)])
def test_bad_settings_are_refused(tok: Tokenizer, max_tokens: int, overlap: int) -> None:
    with pytest.raises(InvalidInputError):
        Chunker(tok, max_tokens, overlap)
