"""OpenAI's batch file format, one JSON object a line:

    input   {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {...}}
    output  {"id": "batch_req_...", "custom_id": "a",
             "response": {"status_code": 200, "request_id": "req_...", "body": {...}}, "error": null}
    errors  the same shape for any other status, plus "line" (the input line, 1-based); a line
            that could not be sent: "response": null, "error": {"code", "message"}

`url` is any POST path of the server (api/routes.py `route_at`), aliases included. A line's
identity for resume (`key`) is its custom_id, or its line number when it has none.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from embedserve.api.protocol import clip
from embedserve.api.routes import Route, describe, route_at

Key = str | int  # a custom_id, or the line number of a line without one

INVALID_LINE = "invalid_line"  # error codes of lines that were never sent
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class BatchLine:
    """A line to send: its route, the path it named and its body as JSON bytes."""

    line: int
    custom_id: str
    route: Route[Any]
    path: str
    body: bytes
    sets_priority: bool = False  # the body names its own traffic class


@dataclass(frozen=True)
class Result:
    """A line's outcome: an answer (status, body) or an error that has none (`error`)."""

    line: int
    custom_id: str | None
    status: int | None = None
    body: Any = None
    request_id: str | None = None
    error: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def key(self) -> Key:
        return self.line if self.custom_id is None else self.custom_id

    @property
    def tokens(self) -> int:
        return tokens_of(self.body) if self.ok else 0

    def record(self) -> dict[str, Any]:
        """The output (200) or error line."""
        response = None
        if self.status is not None:
            response = {"status_code": self.status, "request_id": self.request_id, "body": self.body}
        rec: dict[str, Any] = {
            "id": f"batch_req_{uuid.uuid4().hex}",
            "custom_id": self.custom_id,
            "response": response,
            "error": self.error,
        }
        if not self.ok:
            rec["line"] = self.line
        return rec


def answered(line: BatchLine, status: int, body: Any, request_id: str | None = None) -> Result:
    return Result(line.line, line.custom_id, status, body, request_id or new_request_id())


def failed(line: int, custom_id: str | None, code: str, message: str) -> Result:
    return Result(line, custom_id, error={"code": code, "message": message})


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def custom_id_of(obj: Any) -> str | None:
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    return cid if isinstance(cid, str) and cid else None


def read_line(number: int, text: bytes) -> BatchLine | Result:
    """One input line, or the Result that says why it cannot be sent."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        return failed(number, None, INVALID_LINE, f"line {number}: not valid JSON: {e}")
    cid = custom_id_of(obj)
    if not isinstance(obj, dict) or cid is None:
        return failed(number, None, INVALID_LINE, f"line {number}: no custom_id (a non-empty string)")

    def refuse(why: str) -> Result:
        return failed(number, cid, INVALID_LINE, f"line {number} (custom_id {clip(cid)}): {why}")

    missing = [k for k in ("method", "url", "body") if k not in obj]
    if missing:
        return refuse(f"missing {', '.join(missing)}")
    if obj["method"] != "POST":
        return refuse(f"method must be POST, got {clip(obj['method'])}")
    path = obj["url"]
    route = route_at(path) if isinstance(path, str) else None
    if route is None:
        return refuse(f"unknown url {clip(path)}; the POST routes are {describe()}")
    if not isinstance(obj["body"], dict):
        return refuse(f"body must be a JSON object, got {type(obj['body']).__name__}")
    body = obj["body"]
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()  # as a client sends it
    return BatchLine(number, cid, route, path, text, "priority" in body)


def tokens_of(body: Any) -> int:
    """The tokens an answer reports (OpenAI's usage, Cohere's billed units); 0 when it has none."""
    if not isinstance(body, dict):
        return 0
    usage = body.get("usage")
    if isinstance(usage, dict):
        return int(usage.get("total_tokens") or usage.get("prompt_tokens") or 0)
    units = (body.get("meta") or {}).get("billed_units") if isinstance(body.get("meta"), dict) else None
    return int(units.get("input_tokens") or 0) if isinstance(units, dict) else 0
