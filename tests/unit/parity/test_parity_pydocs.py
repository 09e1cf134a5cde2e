"""The built-in `pydocs` dataset: known items from Python's own docs, deterministic, offline."""

from __future__ import annotations

import pytest

from embedserve.parity.bm25 import accuracy_at_1
from embedserve.parity.datasets import DatasetContext, load_dataset
from embedserve.parity.datasets.pydocs import split_source, split_topic, topic_pairs
from embedserve.parity.options import ParityError
from tests.helpers.shared_data import SHARED_DATA


def _count(text: str) -> int:
    return len(text) // 4 + 1  # about a token per four characters, plus one special token


def _ctx() -> DatasetContext:
    return DatasetContext(SHARED_DATA, _count, list(range(100)), 512)


def test_topics_split_into_first_paragraph_and_the_rest() -> None:
    text = 'The "x" statement\n*****************\n\nFirst paragraph says what x\nis for, briefly.\n\n'
    body = "\n\n".join(["More words here. " * 10] * 3)
    query, doc = split_topic(text + body) or ("", "")
    assert query == "First paragraph says what x is for, briefly."
    assert doc.startswith('The "x" statement\n****') and "First paragraph" not in doc
    assert split_topic("T\n***\n\nOnly one paragraph, nothing else to find.") is None
    pairs = topic_pairs()
    assert len(pairs) > 50 and all(q not in d for q, d in pairs.values())


def test_sources_lose_their_module_docstring() -> None:
    src = '"""Sorts the lines of a file by length.\n\nMore."""\n\nimport sys\n' + "x = 1  # pad\n" * 60
    query, doc = split_source(src) or ("", "")
    assert query == "Sorts the lines of a file by length."
    assert doc.startswith("import sys") and '"""' not in doc
    assert split_source("x = 1\n") is None and split_source("def (:\n") is None


def test_pydocs_is_deterministic_spans_the_buckets_and_is_solvable() -> None:
    a = load_dataset("pydocs", _ctx())
    b = load_dataset("pydocs", _ctx())
    assert a.corpus == b.corpus and a.queries == b.queries
    assert set(a.corpus) == set(a.queries) == set(a.qrels) and all(a.qrels[q] == {q: 1} for q in a.qrels)
    sizes = sorted(_count(str(d)) for d in a.corpus.values())
    assert sizes[0] <= 1024 and any(1024 < n <= 4096 for n in sizes)
    long = [k for k in a.corpus if k.startswith("source-")]
    assert len(long) == a.info["long_sources"] == 12
    assert all(4096 < _count(str(a.corpus[k])) <= 16384 for k in long)
    assert any(_count(str(a.corpus[k])) > 8192 for k in long)  # both long buckets are present
    plain = {k: str(v) for k, v in a.corpus.items()}
    bm25 = accuracy_at_1(plain, {k: str(v) for k, v in a.queries.items()}, a.qrels)
    assert bm25 > 10 / len(plain)  # a real task: far above chance, far from solved by words alone


def test_pydocs_options() -> None:
    small = load_dataset("pydocs?docs=10&long=0", _ctx())
    assert len(small.corpus) == 10 and not any(k.startswith("source-") for k in small.corpus)
    with pytest.raises(ParityError, match="min_long < max_long"):
        load_dataset("pydocs?min_long=9000&max_long=5000", _ctx())
    with pytest.raises(ParityError, match="unknown option"):
        load_dataset("pydocs?doc=3", _ctx())
