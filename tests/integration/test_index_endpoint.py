"""Indexing through a real `embedserve serve` process, searching with the in-process engine:
both sides compute the same embedding_schema, so their vectors meet safely."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from embedserve import Engine
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.http_embedder import HttpEmbedder
from embedserve.index.search import search
from embedserve.index.store import LIVE, Store
from tests.helpers.server_process import ServerProcess
from tests.integration.conftest import API_KEY

DOCS = {
    "wing.txt": "Flutter of a swept wing at transonic speed.\n\nThe wing bends and twists.",
    "shock.md": "An oblique shock wave reflects from the wall of the channel.",
}


def test_endpoint_index_then_in_process_search(
    api_server: ServerProcess, ref_engine: Engine, qwen3_dir: Path, tmp_path: Path
) -> None:
    local = EngineEmbedder(ref_engine, "tiny-qwen3")  # shares the session engine: not closed here
    remote = HttpEmbedder(api_server.base_url, api_key=API_KEY)
    try:
        assert remote.meta.embedding_schema == local.meta.embedding_schema
        assert remote.meta.model == "tiny-qwen3" and remote.max_tokens == 8192
        texts = list(DOCS.values())
        np.testing.assert_allclose(remote.embed_documents(texts), local.embed_documents(texts), atol=1e-5)
    finally:
        remote.close()

    for name, text in DOCS.items():
        (tmp_path / name).write_text(text)
    store_path = str(tmp_path / "e.db")
    cmd = [sys.executable, "-m", "embedserve", "index", str(tmp_path), "--store", store_path]
    out = subprocess.run(
        [*cmd, "--endpoint", api_server.base_url, "--api-key", API_KEY, "--tokenizer", str(qwen3_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "2 documents -> 2 chunks: 2 embedded" in out.stdout

    store = Store(store_path)
    try:
        rows = store.rows(store.resolve(LIVE))
        assert {r["model"] for r in rows} == {"tiny-qwen3"}
        [hits] = search(store, local, [DOCS["shock.md"]], k=2)
        assert hits[0].doc_id == "shock.md"
    finally:
        store.close()


def test_endpoint_without_tokenizer_cannot_chunk(api_server: ServerProcess, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    cmd = [
        sys.executable,
        "-m",
        "embedserve",
        "index",
        str(tmp_path / "a.txt"),
        "--store",
        str(tmp_path / "x.db"),
    ]
    cmd += ["--endpoint", api_server.base_url, "--api-key", API_KEY]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "pass --tokenizer with --endpoint" in out.stderr
