"""OpenAI's Files and Batches routes on the server and the gateway (`--batch-dir DIR`):

    POST /v1/files (multipart: file, purpose=batch)   GET /v1/files[?purpose=]
    GET /v1/files/{id}   GET /v1/files/{id}/content   DELETE /v1/files/{id}
    POST /v1/batches   GET /v1/batches[?after=&limit=]   GET /v1/batches/{id}
    POST /v1/batches/{id}/cancel

Without `--batch-dir` each answers 404 naming the flag. Uploads stream to disk (a spooled
temporary file, then the store) and are refused with 413 past `max_file_bytes`. With API keys,
each key is a tenant: it sees only the files and batches it created (batch/store.py `owner_of`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Any, BinaryIO

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from embedserve.api.http import ClientGone, body_too_large
from embedserve.api.protocol import ApiError
from embedserve.api.routes import ROUTES
from embedserve.batch.online import COMPLETION_WINDOWS, BatchJobs
from embedserve.batch.openapi import (
    CONTENT,
    UPLOAD_BODY,
    BatchList,
    BatchObject,
    FileDeleted,
    FileList,
    FileObject,
    responses,
)
from embedserve.batch.store import Record, new_id, owner_of, public

# The POST paths these routes add beside api/routes.py's (the routes' own test lists them).
POST_PATHS = ("/v1/files", "/v1/batches", "/v1/batches/{batch_id}/cancel")
OFF = "the batch API is off: start with --batch-dir DIR to enable /v1/files and /v1/batches"
_LIST_MAX = 100


def _limit_schema(schema: dict[str, Any]) -> None:
    """`limit` as the API takes it; read as text so a bad value gets this API's 400."""
    schema.clear()
    schema.update(type="integer", minimum=1, maximum=_LIST_MAX, default=20, title="Limit")


_Limit = Annotated[str | int, Query(json_schema_extra=_limit_schema)]


class BatchRequest(BaseModel):
    """POST /v1/batches (fields OpenAI added later, e.g. output_expires_after, are ignored)."""

    model_config = ConfigDict(extra="ignore")
    input_file_id: str
    # what `BatchJobs.create` checks (its 400s), as `/openapi.json` says it
    endpoint: Annotated[str, WithJsonSchema({"type": "string", "enum": [p for r in ROUTES for p in r.paths]})]
    completion_window: Annotated[str, WithJsonSchema({"type": "string", "enum": list(COMPLETION_WINDOWS)})]
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


def add_batch_routes(
    app: FastAPI,
    jobs: Callable[[], BatchJobs | None],
    dependencies: list[Any],
    keyed: bool | Callable[[], bool],
    max_file_bytes: int,
    owner_of_key: Callable[[str], str | None] = owner_of,
) -> None:
    """The routes on `app`; `jobs()`: the running batch jobs, None when the API is off; `keyed`:
    the app checks API keys (each key then owns its files and batches, or, with
    `owner_of_key`, whoever that says the key belongs to: a gateway's tenant)."""

    def on() -> BatchJobs:
        found = jobs()
        if found is None:
            raise ApiError(404, OFF, "not_found_error")
        return found

    def is_keyed() -> bool:
        return keyed() if callable(keyed) else keyed

    def owner(request: Request) -> str | None:
        key = request.headers.get("authorization", "").partition(" ")[2].strip()
        return owner_of_key(key) if is_keyed() else None

    def doc(model: type[BaseModel] | None, *statuses: int, **extra: Any) -> dict[str, Any]:
        return {
            "dependencies": dependencies,
            "response_model": None,
            "responses": {**responses(model, is_keyed(), 404, *statuses), **extra.pop("responses", {})},
            **extra,
        }

    @app.post("/v1/files", **doc(FileObject, 400, 413, openapi_extra=UPLOAD_BODY))
    async def upload(request: Request) -> Record:
        store = on().store
        form = await _form(request, max_file_bytes)
        try:
            purpose, file = form.get("purpose"), form.get("file")
            unknown = sorted(set(form.keys()) - {"purpose", "file"})
            if unknown:
                names = [k[:40] for k in unknown[:5]]
                raise ApiError(
                    400, f"unknown multipart fields {names}: POST /v1/files takes file and purpose"
                )
            if purpose != "batch":
                raise ApiError(400, f"purpose must be 'batch', got {str(purpose)[:40]!r}")
            if not isinstance(file, UploadFile):
                raise ApiError(400, "multipart field 'file' (the JSONL file) is missing")
            file_id = new_id("file-")
            tmp = store.files_dir / f".upload-{file_id}.tmp"
            await asyncio.to_thread(_copy, file.file, tmp)
            os.replace(tmp, store.content_path(file_id))
            return public(store.add_file(file_id, file.filename or "upload.jsonl", "batch", owner(request)))
        finally:
            await form.close()

    @app.get("/v1/files", **doc(FileList))
    async def files(request: Request, purpose: str | None = None) -> Record:
        recs = on().store.files(owner(request), purpose)
        return {"object": "list", "data": [public(r) for r in recs], "has_more": False}

    @app.get("/v1/files/{file_id}", **doc(FileObject))
    async def file(request: Request, file_id: str) -> Record:
        return public(on().store.file(file_id, owner(request)))

    @app.get("/v1/files/{file_id}/content", **doc(None, responses=CONTENT))
    async def content(request: Request, file_id: str) -> FileResponse:
        store = on().store
        rec = store.file(file_id, owner(request))
        return FileResponse(
            store.content_path(file_id), media_type="application/jsonl", filename=rec["filename"]
        )

    @app.delete("/v1/files/{file_id}", **doc(FileDeleted, 409))
    async def delete(request: Request, file_id: str) -> Record:
        running = on()
        running.store.file(file_id, owner(request))
        users = [b["id"] for b in running.live.values() if b["input_file_id"] == file_id]
        if users:
            raise ApiError(
                409, f"file {file_id} is the input of unfinished batch {users[0]}; cancel it first"
            )
        running.store.delete_file(file_id, owner(request))
        return {"id": file_id, "object": "file", "deleted": True}

    @app.post("/v1/batches", **doc(BatchObject, 400, openapi_extra=_json_body(BatchRequest)))
    async def create(request: Request) -> Record:
        running = on()
        try:
            body = BatchRequest.model_validate_json(await request.body())
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ApiError(400, f"invalid batch request: {where}: {first['msg']}") from None
        return running.create(
            body.input_file_id, body.endpoint, body.completion_window, body.metadata, owner(request)
        )

    @app.get("/v1/batches", **doc(BatchList, 400))
    async def batches(request: Request, after: str | None = None, limit: _Limit = 20) -> Record:
        limit = str(limit)
        size = int(limit) if limit.isascii() and limit.isdigit() and len(limit) < 6 else 0
        if not 1 <= size <= _LIST_MAX:
            raise ApiError(400, f"limit must be an integer in 1..{_LIST_MAX}, got {limit[:20]!r}")
        recs = on().list(owner(request))
        ids = [r["id"] for r in recs]
        start = ids.index(after) + 1 if after in ids else 0
        page = recs[start : start + size]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + size < len(recs),
        }

    @app.get("/v1/batches/{batch_id}", **doc(BatchObject))
    async def batch(request: Request, batch_id: str) -> Record:
        return on().get(batch_id, owner(request))

    @app.post("/v1/batches/{batch_id}/cancel", **doc(BatchObject, 409))
    async def cancel(request: Request, batch_id: str) -> Record:
        return on().cancel(batch_id, owner(request))


async def _form(request: Request, limit: int) -> Any:
    """The multipart form, its file part spooled to disk as it arrives; 413 past `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "POST /v1/files takes multipart/form-data (fields 'file' and 'purpose')")

    async def counted() -> AsyncGenerator[bytes, None]:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise body_too_large(limit)
            yield chunk

    try:
        return await MultiPartParser(request.headers, counted(), max_files=1, max_fields=8).parse()
    except MultiPartException as e:
        raise ApiError(400, f"unreadable multipart body: {e.message}") from None
    except ClientDisconnect:
        raise ClientGone("client disconnected while uploading") from None


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _copy(source: BinaryIO, target: Any) -> None:
    source.seek(0)
    with open(target, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())
