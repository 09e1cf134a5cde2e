"""What `/openapi.json` says about the Files and Batches routes (batch/http.py): OpenAI's File and
Batch objects, their lists, the multipart upload, and every status each route answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from embedserve.api.openapi import ErrorResponse


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int = Field(ge=0)
    created_at: int
    expires_at: int = Field(description="when retention (--batch-retention) removes it")
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    status_details: None = None


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class RequestCounts(BaseModel):
    total: int = Field(ge=0)
    completed: int = Field(ge=0)
    failed: int = Field(ge=0)


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = Field(default=None, description="the input line (1-based)")


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[BatchError] = Field(description="the first 100 bad lines; all of them in error_file_id")


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: Literal["24h"]
    status: Literal[
        "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
    ]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    usage: dict[str, Any] | None = Field(default=None, description="input tokens of the answered lines")


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


_WHY = {
    400: "bad request: a field's value (purpose, endpoint, completion_window, limit), a body that is "
    "not multipart/form-data or not the request's JSON shape",
    401: "missing or wrong API key (only when the server has keys)",
    404: "no such file or batch (or another API key's), or the batch API is off (no --batch-dir)",
    409: "cancel of a finished batch, or delete of the input file of an unfinished one",
    413: "upload over --batch-max-file-bytes",
}

UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "additionalProperties": False,
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "JSONL, a request a line",
                        },
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}
CONTENT: dict[int | str, dict[str, Any]] = {
    200: {"description": "the file's bytes", "content": {"application/jsonl": {"schema": {"type": "string"}}}}
}


def responses(model: type[BaseModel] | None, keyed: bool, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route: 200 with `model`, then each status with the error body."""
    out: dict[int | str, dict[str, Any]] = {} if model is None else {200: {"model": model}}
    for status in sorted({*statuses, *((401,) if keyed else ())}):
        out[status] = {"model": ErrorResponse, "description": _WHY[status]}
    return out
