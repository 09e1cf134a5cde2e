"""How a line is answered over HTTP by a server or gateway (`Remote`), and what every line
executor shares (server/batch_lines.py answers lines in-process, gateway/batch_lines.py through
the gateway's pools): the line runs at the batch priority and waits out backpressure (429 / 503)
as Retry-After says, at most `retries` times; then the refusal is the line's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx
from pydantic import BaseModel

from embedserve.api.keepalive import MAX_RETRY_AFTER_S
from embedserve.api.protocol import ApiError, error_body
from embedserve.api.refusals import CLASS_HEADER
from embedserve.batch.format import UNREACHABLE, BatchLine, Result, answered, failed


class LineHost(Protocol):
    """Who answers an online batch's lines and checks them first: the server's pipeline
    (server/batch_lines.py) or the gateway's (gateway/batch_lines.py)."""

    async def __call__(self, line: BatchLine) -> Result: ...

    async def validate(self, line: BatchLine) -> ApiError | None: ...


RETRY_STATUS = (429, 503)
BATCH = "batch"


def retry_after_s(headers: Mapping[str, str]) -> float:
    """Seconds Retry-After asks for (1 s without one), at most the longest any server asks."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), "1")
    try:
        return min(max(float(value), 0.0), float(MAX_RETRY_AFTER_S))
    except ValueError:
        return 1.0


def at_batch_priority(parse: Callable[[bytes], BaseModel]) -> Callable[[bytes], BaseModel]:
    """A route's parser whose requests run as batch work unless the body chose a priority
    (routes without a `priority` field have no classes: api/routes.py `body_priority`)."""

    def parse_batch(body: bytes) -> BaseModel:
        req = parse(body)
        if "priority" in type(req).model_fields and "priority" not in req.model_fields_set:
            return req.model_copy(update={"priority": BATCH})
        return req

    return parse_batch


class Remote:
    """Lines POSTed to `base` + their url, with the batch traffic class header unless the body
    names its own (a gateway sends them to its batch pools; a plain server reads only the body)."""

    def __init__(self, base: str, client: httpx.AsyncClient, retries: int) -> None:
        self.base = base.rstrip("/")
        self.client = client
        self.retries = retries
        self.headers = {"content-type": "application/json"}

    async def __call__(self, line: BatchLine) -> Result:
        url = self.base + line.path
        headers = self.headers if line.sets_priority else {**self.headers, CLASS_HEADER: BATCH}
        for attempt in range(self.retries + 1):
            try:
                resp = await self.client.post(url, content=line.body, headers=headers)
            except httpx.HTTPError as e:
                if attempt < self.retries:
                    await asyncio.sleep(1.0)
                    continue
                return failed(line.line, line.custom_id, UNREACHABLE, f"{url}: {type(e).__name__}: {e}")
            if resp.status_code in RETRY_STATUS and attempt < self.retries:
                await asyncio.sleep(retry_after_s(resp.headers))
                continue
            return answered(line, resp.status_code, _json(resp), resp.headers.get("x-request-id"))
        raise AssertionError("unreachable: the last attempt returns")


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return error_body(f"the answer is not JSON: {resp.text[:300]}", "server_error", resp.status_code)
