"""Dataset loaders give the documented counts; the synthetic generator is deterministic and solvable."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedserve.parity.bm25 import accuracy_at_1
from embedserve.parity.datasets import Dataset, DatasetContext, load_dataset
from embedserve.parity.datasets.cranfield import EMPTY_DOC
from embedserve.parity.datasets.synthetic import generate
from embedserve.parity.options import ParityError
from tests.helpers.shared_data import SHARED_DATA, needs_shared_data
from tests.helpers.tiny_models import qwen_tokenizer_dir


def _words(text: str) -> int:
    return len(text.split()) + 1  # a tokenizer-free counter: one "special" token + words


def _ctx(max_length: int | None = 32768, count=_words) -> DatasetContext:  # type: ignore[no-untyped-def]
    return DatasetContext(SHARED_DATA, count, list(range(1000, 5000)), max_length)


def _digest(ds: Dataset) -> str:
    blob = json.dumps([ds.corpus, ds.queries, ds.qrels], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@needs_shared_data("cranfield")
def test_cranfield_counts_and_quirks() -> None:
    ds = load_dataset("cranfield", _ctx())
    assert (len(ds.corpus), len(ds.queries), len(ds.qrels)) == (1400, 225, 225)
    assert sum(len(j) for j in ds.qrels.values()) == 1612  # 1,837 qrels rows minus 225 with code -1
    assert {g for j in ds.qrels.values() for g in j.values()} == {1, 2, 3, 4}  # gain = 5 - code
    # queries are numbered by position: the third is printed as `.I 004`
    assert str(ds.queries["3"]).startswith("what problems of heat conduction in composite slabs")
    assert ds.qrels["1"]["184"] == 3  # cranqrel "1 184 2"
    assert ds.corpus["471"] == EMPTY_DOC and ds.qrels["125"]["995"] == 2
    small = load_dataset("cranfield?queries=10&docs=100", _ctx())
    judged = {d for j in small.qrels.values() for d in j}
    assert len(small.queries) == 10 and judged <= set(small.corpus) and len(small.corpus) == 100


@needs_shared_data("peps")
def test_peps_known_item_pairs() -> None:
    ds = load_dataset("peps", _ctx())
    assert len(ds.corpus) == len(ds.queries) == len(ds.qrels) == 677
    assert str(ds.queries["pep-0484"]).startswith(":pep:`3107` introduced syntax for function annotations")
    doc = str(ds.corpus["pep-0484"])
    assert "Abstract\n====" not in doc and not doc.startswith("PEP:") and "Rationale and Goals" in doc
    assert all(ds.qrels[q] == {q: 1} for q in ds.queries)
    sample = load_dataset("peps?docs=12", _ctx())
    assert len(sample.corpus) == 12
    sizes = sorted(len(str(t)) for t in sample.corpus.values())
    assert sizes[0] < 3000 < 60000 < sizes[-1]  # spread over the length range, not the first 12


def test_passkey_is_deterministic() -> None:
    a = generate("passkey", _words, [64, 300], per_length=3, seed=0)
    b = generate("passkey", _words, [64, 300], per_length=3, seed=0)
    assert _digest(a) == _digest(b) == "ff9fd83a7f6fece3"
    assert _digest(generate("passkey", _words, [64, 300], per_length=3, seed=1)) != _digest(a)
    assert _digest(generate("needle", _words, [64, 300], per_length=3, seed=0)) == "708dc63a11690b12"


@pytest.mark.parametrize("kind", ["passkey", "needle"])
def test_synthetic_hits_token_targets_and_is_bm25_solvable(kind: str) -> None:
    tok = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tok.encode(text).ids)

    ds = generate(kind, count, [256, 1024], per_length=4, seed=7, max_length=3000)
    docs = ds.info["documents"]
    assert len(ds.corpus) == len(ds.queries) == 12  # 2 lengths + a probe past the 3,000 limit
    for d in docs:
        assert d["tokens"] == count(str(ds.corpus[d["id"]]))
        assert d["target_tokens"] - 24 <= d["tokens"] <= d["target_tokens"]
    assert [d["depth"] for d in docs[:4]] == [0.0, 0.3333, 0.6667, 1.0]
    assert [d["target_tokens"] for d in docs if d["probe"]] == [3000 + 256] * 4
    plain = {k: str(v) for k, v in ds.corpus.items()}
    assert accuracy_at_1(plain, {k: str(v) for k, v in ds.queries.items()}, ds.qrels) == 1.0
    assert ds.info["bm25_acc@1"] == 1.0
    for doc, where in ((docs[0], "start"), (docs[3], "end")):  # depths 0 and 1
        text = str(ds.corpus[doc["id"]])
        name = next(w for w in str(ds.queries[doc["id"]]).split()[1:] if w[0].isupper())
        pos = text.find(name.rstrip("?").removesuffix("'s"))
        assert pos >= 0
        assert (pos < len(text) // 4) if where == "start" else (pos > len(text) * 3 // 4)


def test_bm25_self_check_rejects_an_ambiguous_dataset() -> None:
    corpus = {"a": "the pass key of Bob is 1", "b": "the pass key of Bob is 2"}
    queries = {"a": "What is the pass key of Bob?"}
    assert accuracy_at_1(corpus, queries, {"a": {"a": 1}}) == 0.0  # a tie is not a hit


def test_random_tokens_deterministic_and_within_limit() -> None:
    a = load_dataset("random-tokens?lengths=8,64,5000&per_length=2&seed=3", _ctx(max_length=4096))
    b = load_dataset("random-tokens?lengths=8,64,5000&per_length=2&seed=3", _ctx(max_length=4096))
    assert a.corpus == b.corpus and not a.queries
    assert sorted(len(v) for v in a.corpus.values()) == [8, 8, 64, 64]
    assert all(isinstance(t, int) and 1000 <= t < 5000 for v in a.corpus.values() for t in v)
    assert a.info["dropped_over_limit"] == [5000]
    with pytest.raises(ParityError, match="exceeds the limit"):
        load_dataset("random-tokens?lengths=5000", _ctx(max_length=4096))


def test_beir_folder(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    corpus = [{"_id": "d1", "title": "Wings", "text": "lift"}, {"_id": "d2", "title": "", "text": "drag"}]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in corpus))
    queries = [{"_id": "q1", "text": "what lifts"}, {"_id": "q2", "text": "unjudged"}]
    (tmp_path / "queries.jsonl").write_text("\n".join(json.dumps(r) for r in queries))
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t0\n")
    ds = load_dataset(str(tmp_path), _ctx())
    assert ds.corpus == {"d1": "Wings lift", "d2": "drag"}
    assert ds.queries == {"q1": "what lifts"} and ds.qrels == {"q1": {"d1": 2, "d2": 0}}
    (tmp_path / "qrels" / "test.tsv").write_text("q1\td9\t1\n")
    with pytest.raises(ParityError, match="unknown doc 'd9'"):
        load_dataset(str(tmp_path), _ctx())


def test_bad_dataset_specs_are_named() -> None:
    with pytest.raises(ParityError, match="unknown dataset 'nope'"):
        load_dataset("nope", _ctx())
    with pytest.raises(ParityError, match="unknown option"):
        load_dataset("passkey?lenghts=256", _ctx())
    with pytest.raises(ParityError, match="not a list of integers"):
        load_dataset("passkey?lengths=abc", _ctx())
