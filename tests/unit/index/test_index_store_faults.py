"""The vector store refusing writes mid-run (a full disk, a stopped Milvus), then the same
`embedserve index` command run again: every chunk stored exactly once (issue #27).

The fault is injected under the CLI, in `Store.upsert`: after N accepted batches it raises
pymilvus's MilvusException, either before writing anything (refused) or after writing half of
the batch (a write that died part-way). The embedder is the deterministic word embedder, so
the test is about the pipeline and the store, not the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pymilvus.exceptions import MilvusException

from embedserve.cli import main
from embedserve.index import commands
from embedserve.index.chunking import Chunker
from embedserve.index.documents import Document
from embedserve.index.embedder import load_tokenizer
from embedserve.index.pipeline import chunk_id
from embedserve.index.store import Store, collection_name
from tests.helpers.index_fakes import WordEmbedder
from tests.helpers.tiny_models import qwen_tokenizer_dir

MAX_TOKENS, OVERLAP, BATCH = 48, 8, 5
ACCEPTED_BATCHES = 3
DOCS = [
    Document(
        f"doc-{i}",
        " ".join(f"Sentence {j} of report {i} on jet noise and wing flutter." for j in range(3 + i % 6)),
    )
    for i in range(16)
]


def _refusing_upsert(accepted: int, partial: bool) -> Callable[..., None]:
    real = Store.upsert
    calls = {"n": 0}

    def upsert(self: Store, collection: str, rows: list[dict[str, Any]]) -> None:
        calls["n"] += 1
        if calls["n"] <= accepted:
            real(self, collection, rows)
            return
        if partial:  # the first half reached the store, then the disk filled up
            real(self, collection, rows[: len(rows) // 2])
        raise MilvusException(message="disk quota exceeded: no space left on device")

    return upsert


def _index(docs_file: Path, db: Path) -> int:
    return main(
        [
            "index", str(docs_file), "--store", str(db), "--max-tokens", str(MAX_TOKENS),
            "--overlap", str(OVERLAP), "--batch-size", str(BATCH), "--progress", "off",
        ]
    )  # fmt: skip


@pytest.mark.parametrize("partial", [False, True], ids=["refused", "half-written"])
def test_store_refusing_writes_then_resume_loses_and_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], partial: bool
) -> None:
    tokenizer = load_tokenizer(qwen_tokenizer_dir())
    embedders: list[WordEmbedder] = []

    def build(spec: object) -> WordEmbedder:
        embedders.append(WordEmbedder(tokenizer))
        return embedders[-1]

    monkeypatch.setattr(commands, "build_embedder", build)
    docs_file = tmp_path / "docs.jsonl"
    docs_file.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n" for d in DOCS))
    db = tmp_path / "store.db"
    schema = WordEmbedder(tokenizer).meta.embedding_schema
    chunker = Chunker(tokenizer, MAX_TOKENS, OVERLAP)
    expected = {chunk_id(schema, d.doc_id, i) for d in DOCS for i in range(len(chunker.split(d.text)))}
    assert len(expected) >= 30  # a few dozen chunks, several batches after the fault

    with monkeypatch.context() as m:
        m.setattr(Store, "upsert", _refusing_upsert(ACCEPTED_BATCHES, partial))
        assert _index(docs_file, db) == 2
    err = capsys.readouterr().err
    assert "refused an operation" in err and "no space left on device" in err
    written_before = ACCEPTED_BATCHES * BATCH + (BATCH // 2 if partial else 0)

    assert _index(docs_file, db) == 0  # the same command, the store accepting writes again
    resumed = embedders[-1].embedded
    assert len(resumed) == len(expected) - written_before  # only what had not landed
    assert f"holds {len(expected)} rows" in capsys.readouterr().out

    store = Store(str(db))
    try:
        collection = collection_name(schema)
        rows = store.rows(collection)
        ids = [str(r["id"]) for r in rows]
        assert store.count(collection) == len(rows) == len(expected)  # 0 lost, 0 duplicate
        assert len(set(ids)) == len(ids) and set(ids) == expected
        assert store.aliases() == {"live": collection}
    finally:
        store.close()
