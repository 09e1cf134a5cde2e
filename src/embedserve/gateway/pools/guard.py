"""Schema guard: index and query vectors must never come from different embedding schemas.

A gateway serves one model, and its routes are linked: online queries are compared with the
documents the batch route indexed. So one `embedding_schema` holds for every pool:

- a pool's schema is pinned by `schema:` in the config, or defined by its first listed upstream;
- at start, pools whose schemas are known and differ make the gateway refuse to start;
- the gateway's schema is fixed the first time one is known and never changes while it runs;
- an upstream reporting any other schema is taken out of rotation (and logged loudly).

Pure functions over what the last health poll saw; upstreams.py applies them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from embedserve.gateway.pools.config import PoolConfig


@dataclass(frozen=True)
class UpstreamReport:
    """What one poll of an upstream learned (`/health/ready`, then `/v1/models`)."""

    ready: bool
    error: str | None = None
    schema: str | None = None
    max_model_len: int | None = None
    card: Mapping[str, Any] = field(default_factory=dict)


def defining_schemas(
    pools: Sequence[PoolConfig], reports: Mapping[str, UpstreamReport]
) -> dict[str, str | None]:
    """Each pool's schema: pinned, else its first listed upstream's (None: not known yet)."""
    out: dict[str, str | None] = {}
    for p in pools:
        first = reports.get(p.upstreams[0])
        out[p.name] = p.schema or (first.schema if first is not None else None)
    return out


def startup_conflict(pools: Sequence[PoolConfig], reports: Mapping[str, UpstreamReport]) -> str | None:
    """Why the gateway must not start (pools define different schemas), or None."""
    known = {name: s for name, s in defining_schemas(pools, reports).items() if s is not None}
    if len(set(known.values())) <= 1:
        return None
    listing = ", ".join(f"{name}={schema}" for name, schema in known.items())
    return (
        f"pools serve different embedding schemas ({listing}): vectors from them are not comparable, "
        "so one gateway must not mix them; point every pool at the same model and settings or pin "
        "the intended schema with `schema:`"
    )


def choose_schema(pools: Sequence[PoolConfig], reports: Mapping[str, UpstreamReport]) -> str | None:
    """The gateway's schema once anything is known: a pin, then a pool's defining upstream,
    then any upstream (pools in config order); None while nothing has answered."""
    defined = [s for s in defining_schemas(pools, reports).values() if s is not None]
    if defined:
        return defined[0]
    for p in pools:
        for url in p.upstreams:
            report = reports.get(url)
            if report is not None and report.schema is not None:
                return report.schema
    return None


def exclusion(pool: PoolConfig, schema: str | None, report: UpstreamReport) -> str | None:
    """Why this upstream must stay out of `pool`'s rotation, or None if it may serve."""
    if not report.ready:
        return report.error or "not ready"
    if report.schema is None:
        return "reported no embedding_schema in /v1/models"
    expected = pool.schema or schema
    if expected is not None and report.schema != expected:
        return (
            f"SCHEMA MISMATCH: reports embedding_schema {report.schema} but pool {pool.name!r} serves "
            f"{expected}; taken out of rotation"
        )
    if report.max_model_len is not None and report.max_model_len < pool.max_tokens:
        return (
            f"max_model_len {report.max_model_len} is below pool {pool.name!r}'s max_tokens "
            f"{pool.max_tokens}: it would refuse inputs routed to it"
        )
    return None
