"""HTTP plumbing shared by the server and the gateway: bodies, disconnects, error shapes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from embedserve.api.protocol import ApiError, error_body

# Not a real HTTP status: the nginx convention for "client closed the request", used in metrics.
CLIENT_CLOSED = 499

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its pending work was cancelled."""


BODY_TIMEOUT_S = 30.0


def body_too_large(limit: int) -> ApiError:
    """413 for a body over `limit` bytes (also run-batch's in-process lines)."""
    return ApiError(413, f"request body exceeds the limit of {limit} bytes")


async def read_body(request: Request, limit: int, timeout: float = BODY_TIMEOUT_S) -> bytes:
    """The body, refused before parsing when over `limit` bytes (413) or when it does not
    arrive whole within `timeout` seconds (408: a client sending one byte a second)."""
    too_big = body_too_large(limit)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():  # counted as it arrives: chunked bodies have no length
            body.extend(chunk)
            if len(body) > limit:
                raise too_big

    try:
        await asyncio.wait_for(receive(), timeout)
    except ClientDisconnect:
        raise ClientGone("client disconnected while sending the body") from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"request body not received within {timeout:g} s") from None
    return bytes(body)


async def unless_disconnected(work: Awaitable[T], wait_disconnect: Callable[[], Awaitable[None]]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientGone.

    Cancelling an `Engine.run_async` aborts its queued inputs and frees their blocks.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()


def disconnect_waiter(request: Request) -> Callable[[], Awaitable[None]]:
    async def wait() -> None:
        # The body is consumed, so the next ASGI message is the disconnect (or none, if the
        # response goes out first and this waiter is cancelled).
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return wait


async def api_error_handler(_: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors (unknown path 404, wrong method 405) in the same error shape."""
    message = f"{exc.detail}: {request.method} {request.url.path[:200]}"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method of the path, not only its first route's
        headers["Allow"] = ", ".join(allowed_methods(request))
    return JSONResponse(
        error_body(message, "invalid_request_error", exc.status_code), exc.status_code, headers=headers
    )


def allowed_methods(request: Request) -> list[str]:
    """The methods some route of the app answers at the request's path (starlette's 405 names
    the methods of the first route whose path matched only)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


async def answered(what: str, work: Callable[[], Awaitable[Response]]) -> Response:
    """A route's work, answered whatever happens: a client that went away gets CLIENT_CLOSED,
    an ApiError passes through, anything else (a bug of ours) is logged as `what` failing and
    answered 500 naming it rather than dropping the connection."""
    try:
        return await work()
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    except ApiError:
        raise
    except Exception as e:
        logging.getLogger(__name__).exception("%s failed", what)
        raise ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error") from e
