"""The refusals and request facts the server and the gateway share, worded once: a `model` field
naming another model (404), too many inputs (400), and the traffic class a body or header sets."""

from __future__ import annotations

from pydantic import BaseModel

from embedserve.api.protocol import ApiError, clip


def model_not_found(requested: str, served: str, who: str = "server") -> ApiError:
    """404 for a `model` field (or /v1/models/{id}) naming another model; one wording, the
    request's value clipped (error messages never echo a whole input back)."""
    return ApiError(
        404, f"model {clip(requested)} not found; this {who} serves {served!r}", "not_found_error"
    )


def too_many_inputs(n_inputs: int, limit: int) -> ApiError:
    """400 for a request over the per-request input limit (server and gateway alike)."""
    return ApiError(400, f"{n_inputs} inputs in one request; the limit is {limit}")


# Traffic class as a header, for clients that cannot add the `priority` body field (the gateway).
CLASS_HEADER = "x-embedserve-priority"


def body_priority(req: BaseModel) -> tuple[str, bool]:
    """(the body's traffic class, whether the body set it): a route without a `priority`
    field is online unless a header says otherwise."""
    return str(getattr(req, "priority", "online")), "priority" in req.model_fields_set
