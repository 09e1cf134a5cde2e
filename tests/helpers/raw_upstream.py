"""A pool on a real loopback socket (asyncio streams, HTTP/1.1 keep-alive by hand), so the
gateway's httpx client really pools, reuses and loses connections: what httpx.MockTransport
cannot show. `drop(conn, nth)` decides, per connection and embeddings request on it (both counted
from 0), whether that request is answered, or dropped unread with a close ("fin") or a reset
("rst"). Health and model requests are always answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

Drop = Callable[[int, int], str | None]  # None: answer; "fin" / "rst": close without an answer

SCHEMA = "es1-raw"


class RawUpstream:
    def __init__(self, drop: Drop) -> None:
        self.drop = drop
        self.connections = 0
        self.answered: list[tuple[int, int, str]] = []  # (connection, request on it, path)
        self.dropped: list[tuple[int, int, str]] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn, self.connections = self.connections, self.connections + 1
        nth = 0
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split()[1]
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
                body = await reader.readexactly(length)
                embed = path == "/v1/embeddings"
                how = self.drop(conn, nth) if embed else None
                if how is not None:
                    self.dropped.append((conn, nth, path))
                    if how == "rst":  # linger 0: close() resets the connection
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.close()
                    return
                if embed:
                    self.answered.append((conn, nth, path))
                    nth += 1
                payload = json.dumps(_answer(path, body)).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        writer.close()


def _answer(path: str, body: bytes) -> dict[str, Any]:
    if path == "/health/ready":
        return {"status": "ready"}
    if path == "/v1/models":
        return {"object": "list", "data": [{"id": "raw", "embedding_schema": SCHEMA, "max_model_len": 4096}]}
    texts = json.loads(body)["input"]
    return {
        "data": [
            {"object": "embedding", "index": i, "embedding": [float(len(t))]} for i, t in enumerate(texts)
        ],
        "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
        "model": "raw",
        "embedding_schema": SCHEMA,
    }


@contextlib.asynccontextmanager
async def raw_upstream(drop: Drop) -> AsyncIterator[RawUpstream]:
    up = RawUpstream(drop)
    up.server = await asyncio.start_server(up._serve, "127.0.0.1", 0)
    up.url = f"http://127.0.0.1:{up.server.sockets[0].getsockname()[1]}"
    try:
        yield up
    finally:
        up.server.close()
