"""Request deadlines across the gateway and the server.

A server answers a request whose queue + compute time passes its deadline with 503 and an error
of type `deadline_exceeded` (its work cancelled): distinct from the other 503s (not ready, no
capacity), because re-sending it elsewhere makes the client wait twice. A caller that will not
wait that long says so with `X-Request-Timeout: SECONDS` (the time it has left); the server
then uses the smaller of that and its own `--request-timeout`. The gateway does the same with
its own end-to-end deadline (`request_timeout_s`), sends the time left on every upstream call
(the Ray Serve ingress passes it to its replicas' handlers) and answers a `deadline_exceeded`
upstream error at once (504), never retrying it on another pool or replica.
"""

from __future__ import annotations

import math
from typing import Any

from embedserve.api.protocol import ApiError

TIMEOUT_HEADER = "x-request-timeout"
DEADLINE_EXCEEDED = "deadline_exceeded"


def header_timeout(value: str | None) -> float | None:
    """The caller's `X-Request-Timeout` in seconds (None when absent); 400 when unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ApiError(
            400, f"header {TIMEOUT_HEADER}: expected a positive number of seconds, got {value[:40]!r}"
        )
    return seconds


def effective_timeout(own: float, caller: float | None) -> float:
    return own if caller is None else min(own, caller)


def is_deadline_error(body: Any) -> bool:
    """Whether an error body (parsed JSON) is a `deadline_exceeded` error."""
    try:
        return bool(body["error"]["type"] == DEADLINE_EXCEEDED)
    except (KeyError, TypeError):
        return False
