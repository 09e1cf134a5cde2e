"""The online batch API's state on disk (`--batch-dir DIR`), written so that a SIGKILL at any
moment leaves it readable:

    DIR/files/<file-id>.jsonl        a file's bytes (uploads; a batch's output and error lines)
    DIR/files/<file-id>.json         its record (OpenAI's File object), written last: a file
                                     without a record does not exist (an upload cut short)
    DIR/batches/<batch-id>.json      a batch's record (OpenAI's Batch object + what resume needs)

Records are written whole to a temporary name, fsynced and renamed over the old one. Keys that
start with "_" are ours (the owner's key fingerprint, the reserved output ids) and never shown.
Every lookup takes the caller's `owner`: another owner's file or batch is a 404, as if it did
not exist (a tenant sees only its own).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from embedserve.api.protocol import ApiError, clip

Record = dict[str, Any]
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
FINAL = ("completed", "failed", "cancelled", "expired")


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def owner_of(api_key: str | None) -> str | None:
    """The fingerprint stored with a tenant's files and batches (never the key itself)."""
    return None if not api_key else hashlib.sha256(api_key.encode()).hexdigest()[:32]


def public(rec: Record) -> Record:
    return {k: v for k, v in rec.items() if not k.startswith("_")}


def write_json(path: Path, rec: Record) -> None:
    """`rec` at `path`, whole or not at all (temporary name, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(rec, f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> Record | None:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


class BatchStore:
    """Files and batch records under one directory, removed `retention_s` after their creation
    (a batch once it is final; its files with it)."""

    def __init__(self, root: Path, retention_s: float) -> None:
        self.root = root
        self.retention_s = retention_s
        self.files_dir = root / "files"
        self.batches_dir = root / "batches"
        for d in (self.files_dir, self.batches_dir):
            d.mkdir(parents=True, exist_ok=True)
        for stale in (*self.files_dir.glob(".*.tmp"), *self.batches_dir.glob(".*.tmp")):
            stale.unlink(missing_ok=True)

    # ---- files -------------------------------------------------------------------------------

    def content_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    def add_file(self, file_id: str, filename: str, purpose: str, owner: str | None) -> Record:
        """The record of a file whose bytes are complete at `content_path(file_id)`."""
        now = int(time.time())
        rec: Record = {
            "id": file_id,
            "object": "file",
            "bytes": self.content_path(file_id).stat().st_size,
            "created_at": now,
            "expires_at": now + int(self.retention_s),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
            "_owner": owner,
        }
        write_json(self.files_dir / f"{file_id}.json", rec)
        return rec

    def file(self, file_id: str, owner: str | None) -> Record:
        rec = _read_json(self.files_dir / f"{file_id}.json") if _ID.match(file_id) else None
        if rec is None or rec.get("_owner") != owner:
            raise ApiError(404, f"no file {clip(file_id)}", "not_found_error")
        return rec

    def files(self, owner: str | None, purpose: str | None = None) -> list[Record]:
        recs = (_read_json(p) for p in self.files_dir.glob("*.json"))
        mine = [r for r in recs if r is not None and r.get("_owner") == owner]
        return sorted(
            (r for r in mine if purpose is None or r.get("purpose") == purpose),
            key=lambda r: (r["created_at"], r["id"]),
            reverse=True,
        )

    def delete_file(self, file_id: str, owner: str | None) -> None:
        self.file(file_id, owner)  # 404 unless it is the caller's
        self._remove_file(file_id)

    def _remove_file(self, file_id: str) -> None:
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)  # gone first: never half a file
        self.content_path(file_id).unlink(missing_ok=True)

    # ---- batches -----------------------------------------------------------------------------

    def save_batch(self, rec: Record) -> None:
        write_json(self.batches_dir / f"{rec['id']}.json", rec)

    def batch(self, batch_id: str, owner: str | None) -> Record:
        rec = _read_json(self.batches_dir / f"{batch_id}.json") if _ID.match(batch_id) else None
        if rec is None or rec.get("_owner") != owner:
            raise ApiError(404, f"no batch {clip(batch_id)}", "not_found_error")
        return rec

    def all_batches(self) -> list[Record]:
        """Every batch, oldest first (the order they run in)."""
        recs = (_read_json(p) for p in self.batches_dir.glob("*.json"))
        return sorted((r for r in recs if r is not None), key=lambda r: (r["created_at"], r["id"]))

    # ---- retention ---------------------------------------------------------------------------

    def sweep(self, now: float | None = None) -> int:
        """Remove what is past retention: final batches with the files they wrote, and files no
        unfinished batch reads. Returns how many records went."""
        cutoff = (time.time() if now is None else now) - self.retention_s
        in_use: set[str] = set()
        removed = 0
        for rec in self.all_batches():
            if rec["status"] in FINAL and rec["created_at"] < cutoff:
                (self.batches_dir / f"{rec['id']}.json").unlink(missing_ok=True)
                for fid in (rec.get("_output_id"), rec.get("_error_id")):
                    if fid:
                        self._remove_file(fid)
                removed += 1
            else:
                in_use.update(
                    f for f in (rec["input_file_id"], rec.get("_output_id"), rec.get("_error_id")) if f
                )
        for path in self.files_dir.glob("*.json"):
            found = _read_json(path)
            if found is not None and found["created_at"] < cutoff and found["id"] not in in_use:
                self._remove_file(found["id"])
                removed += 1
        # Bytes without a record (a crash between the upload's rename and its record) after an hour.
        for path in self.files_dir.glob("*.jsonl"):
            orphan = path.stem not in in_use and not path.with_suffix(".json").exists()
            if orphan and path.stat().st_mtime < time.time() - 3600:
                path.unlink(missing_ok=True)
        return removed
