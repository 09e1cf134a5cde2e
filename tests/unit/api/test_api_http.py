"""Shared HTTP plumbing: body limits and a client that leaves mid-upload."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from embedserve.api.http import ClientGone, read_body
from embedserve.api.protocol import ApiError


def _request(messages: list[dict]) -> Request:
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


def test_body_over_the_limit_is_413() -> None:
    req = _request(
        [
            {"type": "http.request", "body": b"x" * 10, "more_body": True},
            {"type": "http.request", "body": b"x" * 10, "more_body": False},
        ]
    )
    with pytest.raises(ApiError) as err:
        asyncio.run(read_body(req, 15))
    assert err.value.status == 413


def test_disconnect_mid_upload_is_client_gone_not_a_traceback() -> None:
    req = _request([{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}])
    with pytest.raises(ClientGone):
        asyncio.run(read_body(req, 1000))
