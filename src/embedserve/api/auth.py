"""Bearer API keys for the server's and the gateway's own clients (FastAPI dependency)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request

from embedserve.api.protocol import ApiError


def bearer_check(
    keys: tuple[str, ...] | Callable[[], tuple[str, ...]],
) -> Callable[[Request], Awaitable[None]]:
    """A dependency that answers 401 unless `Authorization: Bearer <one of keys>`; no keys: open.
    `keys` may be a function, asked at every request (a gateway's reloadable tenants). Keys are
    never logged nor echoed back."""
    fixed = None if callable(keys) else [k.encode() for k in keys]

    async def check(request: Request) -> None:
        encoded = fixed if fixed is not None else [k.encode() for k in keys()]  # type: ignore[operator]
        if not encoded:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode()
        # compare_digest against every key: timing does not reveal which key (if any) matched.
        matches = [hmac.compare_digest(given, k) for k in encoded]
        if scheme.lower() != "bearer" or not any(matches):
            raise unauthorized()

    return check


def unauthorized() -> ApiError:
    """The 401 for a missing or unknown key (it never says which keys exist)."""
    return ApiError(
        401,
        "missing or invalid API key: send 'Authorization: Bearer <key>'",
        "authentication_error",
        {"WWW-Authenticate": "Bearer"},
    )
