"""`embedserve index / search` as real processes on real text (Python's help() topics, about
80 documents, 1,100 chunks) with a tiny Qwen3 model into Milvus Lite: a SIGKILLed run resumes
to exactly one row per chunk; search finds a chunk's document; a query embedder of another
schema is refused."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.cli import main
from embedserve.index.chunking import Chunker
from embedserve.index.documents import read_documents
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.pipeline import chunk_id
from embedserve.index.store import LIVE, Store
from tests.helpers.real_text import TOPIC_NAMES, topic

MAX_TOKENS, OVERLAP = 128, 16
CHUNKING = ["--max-tokens", str(MAX_TOKENS), "--overlap", str(OVERLAP), "--batch-size", "64"]
KILL_AFTER_CHUNKS = 400


def write_topics(dst: Path) -> Path:
    """The help() topics as .jsonl, each topic's name as its id."""
    dst.write_text("".join(json.dumps({"id": name, "text": topic(name)}) + "\n" for name in TOPIC_NAMES))
    return dst


def embedserve(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "embedserve", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Indexed:
    store: str
    docs: Path
    rows_at_kill: int
    ids_at_kill: list[str]
    rerun: str


def _run_until_killed(cmd: list[str]) -> str:
    """Start the indexer, SIGKILL it once its progress bar passes KILL_AFTER_CHUNKS."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0)
    assert isinstance(proc.stderr, io.FileIO)  # unbuffered: read() returns what has arrived
    seen = bytearray()
    reached = threading.Event()

    def read() -> None:
        assert isinstance(proc.stderr, io.FileIO)
        while chunk := proc.stderr.read(4096):
            seen.extend(chunk)
            done = [int(m) for m in re.findall(rb"\| *(\d+)/\d+ \[", bytes(seen[-400:]))]
            if done and max(done) >= KILL_AFTER_CHUNKS:
                reached.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    finished = reached.wait(timeout=240)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    reader.join(10)
    assert finished, f"the indexer never reported progress:\n{seen.decode(errors='replace')[-3000:]}"
    return seen.decode(errors="replace")


@pytest.fixture(scope="module")
def indexed(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Indexed:
    tmp = tmp_path_factory.mktemp("pydocs-index")
    docs = write_topics(tmp / "topics.jsonl")
    store = str(tmp / "topics.db")
    cmd = [
        sys.executable,
        "-m",
        "embedserve",
        "index",
        str(docs),
        "--store",
        store,
        "--model",
        str(qwen3_dir),
    ]
    _run_until_killed([*cmd, *CHUNKING, "--progress", "on"])
    s = Store(store)
    try:
        assert LIVE not in s.aliases()  # killed before finishing: not served yet
        [collection] = s.client.list_collections()
        rows = s.rows(collection)
    finally:
        s.close()
    rerun = embedserve("index", docs, "--store", store, "--model", qwen3_dir, *CHUNKING)
    assert rerun.returncode == 0, rerun.stderr
    return Indexed(store, docs, len(rows), [r["id"] for r in rows], rerun.stdout)


@pytest.fixture(scope="module")
def embedder(qwen3_dir: Path) -> Iterator[EngineEmbedder]:
    e = EngineEmbedder(Engine.from_pretrained(qwen3_dir), qwen3_dir.name)
    yield e
    e.close()


def test_killed_run_resumes_to_exactly_one_row_per_chunk(indexed: Indexed, embedder: EngineEmbedder) -> None:
    assert indexed.rows_at_kill >= KILL_AFTER_CHUNKS - 64
    assert len(set(indexed.ids_at_kill)) == indexed.rows_at_kill
    schema = embedder.meta.embedding_schema
    assert embedder.tokenizer is not None
    chunker = Chunker(embedder.tokenizer, MAX_TOKENS, OVERLAP)
    docs = list(read_documents([indexed.docs]))
    expected = {(d.doc_id, i) for d in docs for i, _ in enumerate(chunker.split(d.text))}
    store = Store(indexed.store)
    try:
        rows = store.rows(store.resolve(LIVE))
    finally:
        store.close()
    assert len(docs) == len(TOPIC_NAMES) and len(rows) == len(expected) > 1000
    assert indexed.rows_at_kill < len(expected)  # killed before the end
    assert {(r["doc_id"], r["chunk_idx"]) for r in rows} == expected
    assert all(r["id"] == chunk_id(schema, str(r["doc_id"]), int(r["chunk_idx"])) for r in rows)
    assert all(r["embedding_schema"] == schema for r in rows)
    # The rerun embedded only what the killed run had not written.
    m = re.search(r"(\d+) embedded, (\d+) already stored", indexed.rerun)
    assert m, indexed.rerun
    assert int(m.group(2)) == indexed.rows_at_kill and int(m.group(1)) == len(expected) - indexed.rows_at_kill


def test_search_returns_the_doc_of_a_directly_embedded_chunk(
    indexed: Indexed, embedder: EngineEmbedder, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(indexed.store)
    try:
        collection = store.resolve(LIVE)
        last = TOPIC_NAMES[-1]
        picks = store.rows(collection, f'doc_id in ["assert", "lambda", "{last}"] and chunk_idx == 0')
        vectors = embedder.embed_documents([str(r["text"]) for r in picks])
        for row, hits in zip(picks, store.search(collection, vectors, 3), strict=True):
            assert (hits[0].doc_id, hits[0].chunk_idx) == (row["doc_id"], 0)
            assert hits[0].score == pytest.approx(1.0, abs=1e-4) and hits[1].score < 0.9999
    finally:
        store.close()
    # The CLI with the document prompt embeds the query the same way: same top document.
    text = str(picks[0]["text"])
    model = str(embedder.engine.config.model_path)
    args = ["search", text, "--store", indexed.store, "--model", model, "--query-prompt-name", "document"]
    assert main([*args, "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["doc_id"] for h in hits][:1] == [picks[0]["doc_id"]] and hits[0]["text"] == text
    assert set(hits[0]) == {"doc_id", "chunk_idx", "score", "text"}
    assert np.isclose(hits[0]["score"], 1.0, atol=1e-4)


def test_search_with_another_models_schema_is_refused(
    indexed: Indexed, qwen2_dir: Path, embedder: EngineEmbedder, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["search", "shock waves", "--store", indexed.store, "--model", str(qwen2_dir)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "refusing to search" in out.err and embedder.meta.embedding_schema in out.err
    assert len(set(re.findall(r"es1-[0-9a-f]{16}", out.err))) == 2, out.err


def test_cli_refusals_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = ["--endpoint", "http://127.0.0.1:9"]
    assert main(["search", "x", "--store", str(tmp_path / "nodb"), *endpoint]) == 2
    assert "ending in .db" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "missing"), "--store", str(tmp_path / "a.db"), *endpoint]) == 2
    assert "no such file or folder" in capsys.readouterr().err
