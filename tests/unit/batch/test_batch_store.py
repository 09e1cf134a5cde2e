"""The online batch API's pieces without a server: the store's records (crash-safe writes,
owners, retention sweep) and the share of the step budget a job keeps in flight."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from embedserve.api.protocol import ApiError
from embedserve.batch.format import Result
from embedserve.batch.settings import BatchSettings
from embedserve.batch.share import TokenShare
from embedserve.batch.store import BatchStore, owner_of, public


def _file(store: BatchStore, file_id: str, owner: str | None = None, data: bytes = b"{}\n") -> None:
    store.content_path(file_id).write_bytes(data)
    store.add_file(file_id, f"{file_id}.jsonl", "batch", owner)


def _batch(store: BatchStore, batch_id: str, status: str, created: int, input_id: str, **extra: str) -> None:
    store.save_batch(
        {
            "id": batch_id,
            "status": status,
            "created_at": created,
            "input_file_id": input_id,
            "_owner": None,
            **extra,
        }
    )


def test_records_are_owned_and_never_show_the_owner(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, retention_s=3600)
    _file(store, "file-a", owner_of("key-a"))
    rec = store.file("file-a", owner_of("key-a"))
    assert rec["bytes"] == 3 and "_owner" not in public(rec)
    assert owner_of("key-a") != "key-a" and "key-a" not in (tmp_path / "files" / "file-a.json").read_text()
    for who in (None, owner_of("key-b")):
        with pytest.raises(ApiError) as e:
            store.file("file-a", who)
        assert e.value.status == 404
    with pytest.raises(ApiError):
        store.file("../batches/x", None)  # ids are names, never paths
    assert [r["id"] for r in store.files(owner_of("key-a"))] == ["file-a"] and store.files(None) == []


def test_a_crash_leaves_no_half_record_and_temporaries_go_at_start(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, retention_s=3600)
    (store.files_dir / ".upload-file-x.tmp").write_bytes(b"half an upload")
    (store.batches_dir / ".batch_x.json.1234.tmp").write_text("{")
    store.content_path("file-y").write_bytes(b"bytes without a record")
    BatchStore(tmp_path, retention_s=3600)  # a restart
    assert not list(store.files_dir.glob(".*.tmp")) and not list(store.batches_dir.glob(".*.tmp"))
    with pytest.raises(ApiError):
        store.file("file-y", None)  # no record: it does not exist


def test_retention_removes_old_final_batches_and_unused_files_only(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, retention_s=100)
    now = time.time()
    old = int(now) - 1000
    for fid in ("file-in-old", "file-in-running", "file-out-old", "file-loose", "file-new"):
        _file(store, fid)
        if fid != "file-new":
            path = store.files_dir / f"{fid}.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "created_at": old}))
    _batch(store, "batch_done", "completed", old, "file-in-old", _output_id="file-out-old")
    _batch(store, "batch_running", "in_progress", old, "file-in-running")
    # batch_done (with its output file), then the old files no unfinished batch reads
    assert store.sweep(now) == 3
    assert {r["id"] for r in store.files(None)} == {"file-in-running", "file-new"}
    assert not store.content_path("file-out-old").exists() and not store.content_path("file-loose").exists()
    assert [b["id"] for b in store.all_batches()] == ["batch_running"]


def test_the_share_sizes_the_window_from_tokens_per_line() -> None:
    share = TokenShare(lambda: 2048, 0.5, most=64)
    assert share() == 1  # nothing answered yet: one line tells how long lines are
    body = {"usage": {"prompt_tokens": 256, "total_tokens": 256}}
    share.add(Result(1, "a", 200, body))
    assert share() == 4  # 0.5 * 2048 / 256
    for _ in range(100):
        share.add(Result(1, "a", 200, {"usage": {"prompt_tokens": 4, "total_tokens": 4}}))
    assert share() == 64  # short lines: capped
    share.add(Result(1, "a", 400, {"error": {}}))  # refusals carry no tokens and change nothing
    assert share() == 64
    with pytest.raises(ValueError, match="batch share"):
        TokenShare(lambda: 2048, 1.5)
    with pytest.raises(ValueError, match="--batch-share"):
        BatchSettings(Path("x"), share=0)
