"""All-or-nothing validation of a batch's input file before any of it runs: every line's format
(format.py `read_line`), its url against the batch's endpoint, its custom_id once per file, and
what the host would refuse in its body (`host.validate`: the server's checks up to tokenizing).
Every bad line goes to the error file with its line number; the first `SHOWN` also to the
batch's `errors` (OpenAI's shape: code, message, param, line). Memory: the custom_ids only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.api.protocol import clip
from embedserve.api.routes import route_at
from embedserve.batch.execute import LineHost
from embedserve.batch.format import INVALID_LINE, BatchLine, Result, failed, read_line
from embedserve.batch.resume import input_lines

SHOWN = 100


@dataclass
class Validated:
    lines: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first SHOWN
    bad: int = 0


async def validate(path: Path, endpoint: str, host: LineHost, errors_file: Path) -> Validated:
    """Check every line of `path`; the bad ones written to `errors_file` (created only if any)."""
    route = route_at(endpoint)
    outcome = Validated()
    seen: set[str] = set()
    sink = None
    try:
        if not path.exists():
            return _refused(outcome, f"the input file {path.stem} is gone (deleted)")
        for number, text in input_lines(path):
            outcome.lines += 1
            bad = await _check(number, text, route, endpoint, host, seen)
            if bad is None:
                continue
            outcome.bad += 1
            if len(outcome.errors) < SHOWN:
                code = (bad.error or {}).get("code", INVALID_LINE)
                outcome.errors.append({"code": code, "message": _message(bad), "param": None, "line": number})
            if sink is None:
                sink = errors_file.open("wb")
            sink.write(json.dumps(bad.record(), ensure_ascii=False).encode() + b"\n")
        if outcome.lines == 0:
            return _refused(outcome, "the input file has no lines")
        return outcome
    finally:
        if sink is not None:
            sink.close()


def _refused(outcome: Validated, message: str) -> Validated:
    outcome.errors.append({"code": "empty_file", "message": message, "param": None, "line": None})
    return outcome


async def _check(
    number: int, text: bytes, route: Any, endpoint: str, host: LineHost, seen: set[str]
) -> Result | None:
    """Why line `number` cannot run (a Result for the error file), or None."""
    item = read_line(number, text)
    if isinstance(item, Result):
        return item
    assert isinstance(item, BatchLine)
    cid = item.custom_id

    def refuse(code: str, why: str) -> Result:
        return failed(number, cid, code, f"line {number} (custom_id {clip(cid)}): {why}")

    if item.route is not route:
        return refuse(INVALID_LINE, f"url {clip(item.path)} is not the batch's endpoint {endpoint}")
    if cid in seen:
        return refuse("duplicate_custom_id", "this custom_id is on an earlier line; each needs its own")
    seen.add(cid)
    refusal = await host.validate(item)
    if refusal is not None:
        return refuse(refusal.kind, f"{refusal.status}: {refusal.message}")
    return None


def _message(result: Result) -> str:
    return (result.error or {}).get("message", "")
