"""Sparse and hybrid indexes through an endpoint (#44): `index --sparse --endpoint URL` on a SPLADE
server, `index --hybrid --endpoint URL` on a BGE-M3 server (both sides from it) and
`--sparse-model URL` beside a dense model store the same rows as the same models in this
process; a dense server asked for sparse vectors is refused with the server's reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from embedserve import Engine
from embedserve.cli import main
from embedserve.index.engine_embedder import EngineEmbedder
from embedserve.index.errors import EndpointError, StoreError
from embedserve.index.http_embedder import HttpEmbedder
from embedserve.index.sparse import EMPTY_ROW, SparseEmbedder
from embedserve.index.store import Store
from tests.helpers.inprocess import Via, server_client
from tests.helpers.real_text import topic
from tests.helpers.server_process import start_server
from tests.helpers.tiny_bert import minilm_dir
from tests.helpers.tiny_sparse import build_bge_m3, build_splade

TEXTS = [topic("raise")[:400], topic("yield")[:300], "raise an exception", "."]


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_splade(tmp_path_factory.mktemp("splade") / "max")


@pytest.fixture(scope="module")
def m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bge_m3(tmp_path_factory.mktemp("m3") / "m3")


@pytest.fixture(scope="module")
def splade_server(splade: Path) -> Iterator[TestClient]:
    with server_client(splade) as client:
        yield client


def _remote(client: TestClient) -> SparseEmbedder:
    return SparseEmbedder(HttpEmbedder("http://testserver", transport=Via(client), sparse=True))


def _close_rows(got: list[dict[int, float]], want: list[dict[int, float]]) -> None:
    assert [sorted(g) for g in got] == [sorted(w) for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose([g[i] for i in sorted(g)], [w[i] for i in sorted(w)], rtol=1e-5, atol=1e-5)


def test_a_splade_servers_rows_are_the_engines(splade: Path, splade_server: TestClient) -> None:
    remote = _remote(splade_server)
    try:
        with Engine.from_pretrained(splade) as engine:
            local = SparseEmbedder(EngineEmbedder(engine, "splade"))
            _close_rows(remote.embed_documents(TEXTS), local.embed_documents(TEXTS))
            _close_rows(remote.embed_queries(TEXTS), local.embed_queries(TEXTS))
            # the sparse schema the server reports for these vectors: an index built through the
            # server and one built in process are the same index
            card = splade_server.get("/v1/models").json()["data"][0]
            assert remote.meta.embedding_schema == local.meta.embedding_schema == card["embedding_schema"]
        assert remote.embed_documents([]) == []
    finally:
        remote.close()


def test_bge_m3_lexical_weights_through_its_server(m3: Path) -> None:
    with server_client(m3) as client, Engine.from_pretrained(m3) as engine:
        remote = _remote(client)
        try:
            got = remote.embed_documents(TEXTS)
            local = SparseEmbedder(EngineEmbedder(engine, "m3"))
            _close_rows(got, local.embed_documents(TEXTS))
            assert remote.meta.embedding_schema == local.meta.embedding_schema
            assert got[-1] == EMPTY_ROW  # "." has no lexical weight: stored as Milvus takes it
        finally:
            remote.close()


def test_a_dense_server_asked_for_sparse_vectors_is_refused() -> None:
    with server_client(minilm_dir()) as client:
        with pytest.raises(EndpointError, match="400") as e:
            HttpEmbedder("http://testserver", transport=Via(client), sparse=True)
        assert "sparse" in str(e.value)
        dense = HttpEmbedder("http://testserver", transport=Via(client))
        try:
            with pytest.raises(StoreError, match="dense vectors only"):
                SparseEmbedder(dense)
        finally:
            dense.close()


@pytest.mark.slow  # CI time (2026-12-07): its area keeps a representative in CI
def test_cli_hybrid_through_a_bge_m3_server_equals_the_model_in_process(
    m3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`index --hybrid --endpoint URL` (both sides from the server) stores the rows `index --hybrid
    --model DIR` stores, and `search --hybrid rrf` through the server ranks as in process."""
    docs = tmp_path / "docs.jsonl"
    names = ("assert", "raise", "yield", "return")
    docs.write_text("".join(json.dumps({"id": n, "text": topic(n)}) + "\n" for n in names))
    chunking = ["--max-tokens", "64", "--overlap", "0", "--tokenizer", str(m3)]
    server = start_server(m3, tmp_path, "--warmup-lengths", "8")
    try:
        server.wait_ready()
        remote = ["--endpoint", server.base_url, "--store", str(tmp_path / "remote.db")]
        local = ["--model", str(m3), "--store", str(tmp_path / "local.db")]
        for source in (remote, local):
            assert main(["index", str(docs), *source, *chunking, "--hybrid"]) == 0
        hits = []
        for source in (remote, local):
            assert main(["search", topic("raise")[:300], *source, "--hybrid", "rrf", "--json"]) == 0
            hits.append(json.loads(capsys.readouterr().out.splitlines()[-1]))
        ids = [[(h["doc_id"], h["chunk_idx"]) for h in found] for found in hits]
        assert ids[0] == ids[1] and len(ids[0]) == 10
        np.testing.assert_allclose([h["score"] for h in hits[0]], [h["score"] for h in hits[1]], rtol=1e-4)
        rows = []
        for db in ("remote.db", "local.db"):
            store = Store(str(tmp_path / db))
            try:
                found = store.rows(store.resolve("live"), fields=["id", "sparse"])
                rows.append({r["id"]: r["sparse"] for r in found})
            finally:
                store.close()
        assert rows[0].keys() == rows[1].keys() and len(rows[0]) > 8  # ids name the schema: the same index
        for key, row in rows[1].items():
            _close_rows([dict(rows[0][key])], [dict(row)])
    finally:
        server.terminate()


@pytest.mark.slow  # CI time (2026-12-07): the sparse CLI stays in CI through test_index_sparse
def test_cli_sparse_model_url_beside_a_dense_model(
    splade: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--sparse-model URL` beside a dense `--model`: the SPLADE server gets none of the dense
    side's options (`--dimensions` would be its 400); the sparse rows are the server's."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": n, "text": topic(n)}) + "\n" for n in ("raise", "yield")))
    server = start_server(splade, tmp_path, "--warmup-lengths", "8")
    try:
        server.wait_ready()
        source = ["--model", str(minilm_dir()), "--dimensions", "128", "--sparse-model", server.base_url]
        db = ["--store", str(tmp_path / "h.db")]
        assert (
            main(["index", str(docs), *db, *source, "--max-tokens", "64", "--overlap", "0", "--hybrid"]) == 0
        )
        assert main(["search", "raise an exception", *db, *source, "--hybrid", "rrf", "--json"]) == 0
        hits = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert len(hits) == 10 and {h["doc_id"] for h in hits} <= {"raise", "yield"}
    finally:
        server.terminate()
