"""The online batch API's jobs (`--batch-dir`): OpenAI's Batch objects, run one at a time in
creation order on the host that serves the API (a server's own pipeline, or a gateway's pools):

    validating -> in_progress -> finalizing -> completed
        |              |--- cancel ---> cancelling -> cancelled
        |              '--- completion window over -> expired
        '-- any bad line --> failed (every bad line in the error file, the first ones in `errors`)

Validation is all-or-nothing and runs before any engine work: each line's JSON, custom_id (once
per file), method, url (the batch's endpoint) and what the host would refuse in its body (task,
model, limits, tokens). Lines then run on runner.py's ordered window as batch work; each answer
is appended to the output (200) or error file as soon as it and every line before it are done.

Durability: a batch's record and its two files are all its state. After a SIGKILL the next start
finds it `in_progress` and computes only the custom_ids missing from both files (resume.py cuts
a half-written last line), so every line appears exactly once. Cancelled and expired batches
keep what they answered, as OpenAI's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from embedserve.api.protocol import ApiError, clip
from embedserve.api.routes import route_at
from embedserve.batch.counts import Counts
from embedserve.batch.execute import LineHost
from embedserve.batch.format import Result
from embedserve.batch.resume import resume_point
from embedserve.batch.runner import Sink, lines_left, run
from embedserve.batch.store import FINAL, BatchStore, Record, new_id, public
from embedserve.batch.validate import validate

log = logging.getLogger(__name__)

COMPLETION_WINDOWS = {"24h": 24 * 3600}
# Whose batch the lines being validated or answered belong to (its `_owner`): a gateway's line
# host runs them as that tenant (gateway/batch_lines.py).
BATCH_OWNER: ContextVar[str | None] = ContextVar("embedserve_batch_owner", default=None)


class BatchJobs:
    """Creates, runs, cancels and resumes batches; `window()`: the lines a batch keeps in flight
    now; `ready()`: returns once the host can answer lines (a server after its warm-up)."""

    def __init__(
        self,
        store: BatchStore,
        host: LineHost,
        window: Callable[[], int],
        ready: Callable[[], Awaitable[None]],
        on_result: Callable[[Result], None] = lambda _: None,
    ) -> None:
        self.store = store
        self.host = host
        self.window = window
        self.ready = ready
        self.on_result = on_result
        self.live: dict[str, Record] = {}  # batches not final yet: the records being changed
        self._stops: dict[str, asyncio.Event] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's (routes may run on another)

    async def start(self) -> None:
        """Queue every unfinished batch on disk (oldest first), start the worker and the sweeper."""
        self.store.sweep()
        for rec in self.store.all_batches():
            if rec["status"] not in FINAL:
                self.live[rec["id"]] = rec
                self._queue.put_nowait(rec["id"])
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._work()), asyncio.create_task(self._sweep())]

    async def close(self) -> None:
        """Stop without finishing anything: a running batch stays `in_progress` on disk and
        resumes at the next start."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    # ---- the API -----------------------------------------------------------------------------

    def create(
        self,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        owner: str | None,
    ) -> Record:
        if completion_window not in COMPLETION_WINDOWS:
            raise ApiError(400, f"completion_window must be one of {list(COMPLETION_WINDOWS)}")
        if route_at(endpoint) is None:
            raise ApiError(400, f"endpoint {clip(endpoint)} is not a POST route of this server")
        source = self.store.file(input_file_id, owner)  # 404 unless it is the caller's
        if source["purpose"] != "batch":
            raise ApiError(400, f"file {input_file_id} has purpose {source['purpose']!r}, not 'batch'")
        now = int(time.time())
        rec: Record = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": input_file_id,
            "completion_window": completion_window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + COMPLETION_WINDOWS[completion_window],
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
            "_owner": owner,
            "_output_id": new_id("file-"),
            "_error_id": new_id("file-"),
        }
        self.store.save_batch(rec)
        self.live[rec["id"]] = rec
        self._on_worker_loop(self._queue.put_nowait, rec["id"])
        return public(rec)

    def get(self, batch_id: str, owner: str | None) -> Record:
        rec = self.live.get(batch_id)
        if rec is None or rec["_owner"] != owner:
            rec = self.store.batch(batch_id, owner)
        return public(rec)

    def list(self, owner: str | None) -> list[Record]:
        """The caller's batches, newest first."""
        recs = [self.live.get(r["id"], r) for r in self.store.all_batches() if r["_owner"] == owner]
        return [public(r) for r in reversed(recs)]

    def cancel(self, batch_id: str, owner: str | None) -> Record:
        self.get(batch_id, owner)  # 404 unless it is the caller's
        rec = self.live.get(batch_id)
        if rec is None:
            status = self.store.batch(batch_id, owner)["status"]
            raise ApiError(409, f"batch {batch_id} is {status}: only an unfinished batch can be cancelled")
        if rec["status"] != "cancelling":
            self._mark(rec, "cancelling")
            stop = self._stops.get(batch_id)
            if stop is not None:
                self._on_worker_loop(stop.set)
        return public(rec)

    # ---- the worker --------------------------------------------------------------------------

    def _on_worker_loop(self, call: Callable[..., Any], *args: Any) -> None:
        if self._loop is None:
            raise ApiError(503, "the batch API is starting", "service_unavailable", {"Retry-After": "1"})
        self._loop.call_soon_threadsafe(call, *args)

    def _mark(self, rec: Record, status: str) -> None:
        rec["status"] = status
        rec[f"{status}_at"] = int(time.time())
        self.store.save_batch(rec)

    async def _work(self) -> None:
        while True:
            batch_id = await self._queue.get()
            rec = self.live.get(batch_id)
            if rec is None:
                continue
            try:
                await self.ready()
                BATCH_OWNER.set(rec["_owner"])  # this worker task's context: its lines' tasks too
                await self._run(rec)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug of ours fails this batch, not the next ones
                log.exception("batch %s failed", batch_id)
                rec["errors"] = {"object": "list", "data": [{"code": "server_error", "message": str(e)}]}
                self._finish(rec, "failed")

    async def _run(self, rec: Record) -> None:
        if rec["status"] == "validating" and not await self._validate(rec):
            return
        if rec["status"] == "in_progress" and time.time() < rec["expires_at"]:
            await self._answer(rec)
        if rec["status"] == "cancelling":
            self._finish(rec, "cancelled")
        elif rec["status"] != "failed" and time.time() >= rec["expires_at"]:
            self._finish(rec, "expired")
        elif rec["status"] in ("in_progress", "finalizing"):
            self._mark(rec, "finalizing")
            self._finish(rec, "completed")

    async def _validate(self, rec: Record) -> bool:
        errors = self.store.content_path(rec["_error_id"])
        path = self.store.content_path(rec["input_file_id"])
        outcome = await validate(path, rec["endpoint"], self.host, errors)
        if rec["status"] == "cancelling":
            return True  # the caller gave up while it was checked: cancelled, nothing run
        rec["request_counts"]["total"] = outcome.lines
        if outcome.errors:
            rec["errors"] = {"object": "list", "data": outcome.errors}
            self._finish(rec, "failed")
            return False
        errors.unlink(missing_ok=True)
        self._mark(rec, "in_progress")
        return True

    async def _answer(self, rec: Record) -> None:
        """The lines not answered yet, in order, until done, cancelled or expired."""
        out = self.store.content_path(rec["_output_id"])
        err = self.store.content_path(rec["_error_id"])
        done_ok, done_failed, tokens = await asyncio.to_thread(resume_point, out, err)
        rec["request_counts"].update(completed=len(done_ok), failed=len(done_failed))
        rec["_tokens"] = tokens
        stop = self._stops[rec["id"]] = asyncio.Event()
        if rec["status"] == "cancelling":  # cancelled while its files were read
            stop.set()
        expiry = asyncio.get_running_loop().call_later(max(rec["expires_at"] - time.time(), 0), stop.set)
        counts = Counts(rec, self.store.save_batch, self.on_result)
        sink = Sink(out, err)
        try:
            items = lines_left(self.store.content_path(rec["input_file_id"]), done_ok | done_failed)
            await run(items, self.host, sink, self.window, stop, counts)
        finally:
            expiry.cancel()
            sink.close()
            del self._stops[rec["id"]]

    def _finish(self, rec: Record, status: str) -> None:
        """The final status, with the files written so far (an output file even when empty, the
        error file when it has lines) registered as `batch_output` files."""
        out = self.store.content_path(rec["_output_id"])
        err = self.store.content_path(rec["_error_id"])
        if status != "failed":
            out.touch()
        for path, key, fid, name in (
            (out, "output_file_id", rec["_output_id"], "output"),
            (err, "error_file_id", rec["_error_id"], "errors"),
        ):
            if path.exists() and (key == "output_file_id" or path.stat().st_size):
                self.store.add_file(fid, f"{rec['id']}_{name}.jsonl", "batch_output", rec["_owner"])
                rec[key] = fid
        tokens = rec.get("_tokens", 0)
        rec["usage"] = {
            "input_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens,
        }
        self._mark(rec, status)
        self.live.pop(rec["id"], None)

    async def _sweep(self) -> None:
        period = min(3600.0, max(self.store.retention_s / 10, 1.0))
        while True:
            await asyncio.sleep(period)
            removed = await asyncio.to_thread(self.store.sweep)
            if removed:
                log.info("batch retention: removed %d records", removed)


@contextlib.asynccontextmanager
async def running(jobs: BatchJobs | None) -> AsyncIterator[None]:
    """`jobs` started for the body's duration (an app's lifespan), closed after; None: nothing."""
    if jobs is None:
        yield
        return
    await jobs.start()
    try:
        yield
    finally:
        await jobs.close()
