"""Slow and hostile clients are bounded and the server keeps serving the others (loopback)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.helpers.fuzz import threaded_server
from tests.helpers.inprocess import server_client, slow_steps
from tests.helpers.server_process import words

KEEP_ALIVE_S = 1


@pytest.fixture(scope="module")
def server(qwen3_dir: Path) -> Iterator[tuple[TestClient, str]]:
    limits: dict[str, Any] = {
        "body_timeout_s": 1.0,
        "request_timeout_s": 1.0,
        "max_body_bytes": 4096,
        "max_inputs_per_request": 8,
        "max_queued_requests": 8,
        "max_queued_tokens": 2000,
    }
    with (
        server_client(qwen3_dir, **limits) as client,
        threaded_server(client.app, timeout_keep_alive=KEEP_ALIVE_S, limit_concurrency=300) as url,
    ):
        yield client, url


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _serves(url: str) -> None:
    resp = httpx.post(f"{url}/v1/embeddings", json={"input": "still serving"}, timeout=30)
    assert resp.status_code == 200, resp.text


def test_a_body_sent_byte_by_byte_gets_408_and_others_are_served(
    server: tuple[TestClient, str],
) -> None:
    _, url = server
    body = b'{"input": "' + b"a" * 60 + b'"}'
    with _connect(url) as s:
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b"Content-Length: %d\r\n\r\n" % len(body))
        start = time.monotonic()
        answer = b""
        for byte in body:
            _serves(url)  # the slow client holds nobody up
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
            s.settimeout(0.01)
            try:
                answer += s.recv(65536)
            except (TimeoutError, BlockingIOError):
                continue
            if answer:
                break
        s.settimeout(10)
        while b"\r\n\r\n" not in answer:
            answer += s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - start < 5


def test_a_request_over_its_deadline_is_cancelled_with_503_and_retry_after(
    server: tuple[TestClient, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, url = server
    with slow_steps(client, monkeypatch, seconds=1.5):  # then: the cancelled work freed its blocks
        resp = httpx.post(f"{url}/v1/embeddings", json={"input": "slow"}, timeout=30)
        assert resp.status_code == 503 and resp.headers["retry-after"].isdigit()
        assert "not answered within 1 s" in resp.json()["error"]["message"]
        assert resp.json()["error"]["type"] == "deadline_exceeded"  # the gateway does not retry it
    _serves(url)


def test_idle_connections_do_not_block_others(server: tuple[TestClient, str]) -> None:
    """250 connections that never send a request: others are still served. (uvicorn closes an
    idle keep-alive connection after --timeout-keep-alive, but not one that never sent a
    request: those are bounded by --limit-concurrency only; docs/reliability.md.)"""
    _, url = server
    idle = [_connect(url) for _ in range(250)]
    try:
        _serves(url)
        with httpx.Client(base_url=url, timeout=30) as keep_alive:  # one used, then left idle
            assert keep_alive.get("/health/live").status_code == 200
            time.sleep(KEEP_ALIVE_S + 1)
            assert keep_alive.get("/health/live").status_code == 200  # reconnects transparently
        _serves(url)
    finally:
        for s in idle:
            s.close()


def test_a_request_just_under_every_limit_is_answered(server: tuple[TestClient, str]) -> None:
    _, url = server
    # 8 inputs (the per-request limit) of 200 words (201 tokens each: 1608 <= 2000 queued tokens)
    # in a body under 4096 bytes.
    inputs = [words(200, seed=i) for i in range(8)]
    body = {"input": inputs}
    assert len(httpx.Request("POST", url, json=body).content) < 4096 * 3  # sanity of the sizes
    short = {"input": [words(60, seed=i) for i in range(8)]}
    size = len(httpx.Request("POST", url, json=short).content)
    assert size <= 4096
    resp = httpx.post(f"{url}/v1/embeddings", json=short, timeout=30)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["data"]) == 8
    over = {"input": [*short["input"], "one more"]}
    assert httpx.post(f"{url}/v1/embeddings", json=over, timeout=30).status_code in (400, 413)
