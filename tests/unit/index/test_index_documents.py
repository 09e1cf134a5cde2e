"""Reading documents: file types, stable ids, refusals that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedserve.index.documents import read_documents
from embedserve.index.errors import DocumentError
from embedserve.index.shadow_io import load_qrels, load_queries


def test_folders_files_and_jsonl(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub" / "b.md").write_text("beta")
    (tmp_path / "sub" / "c.rst").write_text("gamma")
    (tmp_path / "skip.pdf").write_text("not read")
    (tmp_path / "empty.txt").write_text("  \n ")
    lines = [{"id": 7, "text": "seven"}, {"id": "x", "text": "ex"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    docs = list(read_documents([tmp_path]))
    assert [(d.doc_id, d.text) for d in docs] == [
        ("a.txt", "alpha"),
        ("7", "seven"),
        ("x", "ex"),
        ("sub/b.md", "beta"),
        ("sub/c.rst", "gamma"),
    ]
    # A file named directly is identified by its name.
    assert [d.doc_id for d in read_documents([tmp_path / "sub" / "b.md"])] == ["b.md"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "d.jsonl:2: not valid JSON"),
        ('["id", "text"]', "d.jsonl:2: expected an object"),
        ('{"text": "no id"}', "d.jsonl:2: 'id' must be"),
        ('{"id": true, "text": "bool id"}', "d.jsonl:2: 'id' must be"),
        ('{"id": "b", "text": 5}', "d.jsonl:2: 'text' must be a string"),
        ('{"id": "a", "text": "again"}', "document id 'a' appears twice"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"id": "a", "text": "first"}\n' + line + "\n")
    with pytest.raises(DocumentError, match=message.replace("[", r"\[")):
        list(read_documents([f]))


def test_missing_and_unsupported_paths(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="no such file"):
        list(read_documents([tmp_path / "nope"]))
    (tmp_path / "x.pdf").write_text("?")
    with pytest.raises(DocumentError, match="unsupported file type"):
        list(read_documents([tmp_path / "x.pdf"]))


def test_queries_and_qrels_formats(tmp_path: Path) -> None:
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": 1, "text": "first query"}\n')
    assert load_queries(q) == {"1": "first query"}
    with pytest.raises(DocumentError, match=r"\.jsonl"):
        load_queries(tmp_path / "q.txt")
    beir = tmp_path / "beir.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\n1\td1\t2\n1\td2\t0\n2\td3\t1\n")
    assert load_qrels(beir) == {"1": {"d1": 2, "d2": 0}, "2": {"d3": 1}}
    trec = tmp_path / "trec.txt"
    trec.write_text("1 0 d1 3\n1 0 d9 -1\n")
    assert load_qrels(trec) == {"1": {"d1": 3, "d9": -1}}
    bad = tmp_path / "bad.tsv"
    bad.write_text("1 d1 2\n1 d2 high\n")
    with pytest.raises(DocumentError, match=r"bad\.tsv:2"):
        load_qrels(bad)
