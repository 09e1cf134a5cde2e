"""Upstream servers: health polling, the schema guard, and which upstream takes the next part.

Only upstreams in rotation receive traffic: ready at the last poll of `/health/ready`, with an
`embedding_schema` (read from `/v1/models`) equal to the gateway's, and a `max_model_len` that
covers their pool's `max_tokens`. A connection failure during a request takes an upstream out
at once; the next successful poll brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from embedserve.gateway.pools.config import GatewayConfig, GatewayConfigError, PoolConfig
from embedserve.gateway.pools.fair import FairGate
from embedserve.gateway.pools.guard import UpstreamReport, choose_schema, exclusion, startup_conflict

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 5.0
_NOT_POLLED = UpstreamReport(ready=False, error="not polled yet")


@dataclass
class Upstream:
    """One server (it may belong to several pools: its load is counted once)."""

    url: str
    report: UpstreamReport = _NOT_POLLED
    outstanding_tokens: int = 0


class Pool:
    def __init__(self, config: PoolConfig, members: list[Upstream], before: Pool | None = None) -> None:
        """`before`: the pool of this name a reload replaces (its fair-share gate carries over)."""
        self.config = config
        self.members = members
        # Why each member is out of rotation (None: in rotation).
        self.reasons: dict[str, str | None] = {u.url: _NOT_POLLED.error for u in members}
        self._turn = itertools.count()
        limit = config.max_inflight_tokens
        kept: FairGate | None = before.gate if before is not None else None
        # Parts beyond the limit wait, fairly; a reload keeps the gate and what it counts (its
        # new limit applies once the reload swaps: `apply_limits`).
        self.gate: FairGate | None = None
        if limit is not None:
            self.gate = kept if kept is not None else FairGate(limit)

    @property
    def name(self) -> str:
        return self.config.name

    def in_rotation(self) -> list[Upstream]:
        return [u for u in self.members if self.reasons[u.url] is None]

    def choose(self, policy: str) -> list[Upstream]:
        """Upstreams in rotation, best first. Ties rotate, so equal load spreads evenly."""
        ready = self.in_rotation()
        if not ready:
            return []
        start = next(self._turn) % len(ready)
        rotated = ready[start:] + ready[:start]
        if policy == "least_tokens":
            rotated.sort(key=lambda u: u.outstanding_tokens)  # stable: ties keep the rotation
        return rotated


class UpstreamSet:
    def __init__(
        self, config: GatewayConfig, client: httpx.AsyncClient, before: UpstreamSet | None = None
    ) -> None:
        """`before`: the model's pools a reload replaces (pools keeping their names keep their
        fair-share gates: parts still in flight on them count against the new limits)."""
        self.config = config
        self.client = client
        self.upstreams = {url: Upstream(url) for p in config.pools for url in p.upstreams}
        old: dict[str, Pool] = {} if before is None else before.pools
        self.pools: dict[str, Pool] = {
            p.name: Pool(p, [self.upstreams[u] for u in p.upstreams], old.get(p.name)) for p in config.pools
        }
        self.schema: str | None = None  # fixed once known
        self._poller: asyncio.Task[None] | None = None

    def apply_limits(self) -> None:
        """Each pool's `max_inflight_tokens` on its gate (a kept gate still had the old limit
        until the reload that built these pools swapped them in)."""
        for pool in self.pools.values():
            limit = pool.config.max_inflight_tokens
            if pool.gate is not None and limit is not None:
                pool.gate.resize(limit)

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """First poll; refuses (GatewayConfigError) when pools define different schemas."""
        reports = await self._probe_all()
        conflict = startup_conflict(self.config.pools, reports)
        if conflict is not None:
            raise GatewayConfigError(conflict)
        self._apply(reports)
        self._poller = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                self._apply(await self._probe_all())
            except Exception:  # a bug here must not stop health tracking for good
                log.exception("health poll failed")

    # ---- polling ---------------------------------------------------------------------------

    async def _probe_all(self) -> dict[str, UpstreamReport]:
        urls = list(self.upstreams)
        reports = await asyncio.gather(*(self._probe(u) for u in urls))
        return dict(zip(urls, reports, strict=True))

    async def _probe(self, url: str) -> UpstreamReport:
        try:
            ready = await self.client.get(f"{url}/health/ready", timeout=_PROBE_TIMEOUT_S)
            if ready.status_code != 200:
                detail = ready.text[:200]
                return UpstreamReport(
                    ready=False, error=f"/health/ready answered {ready.status_code}: {detail}"
                )
            models = await self.client.get(f"{url}/v1/models", timeout=_PROBE_TIMEOUT_S)
            models.raise_for_status()
            card: dict[str, Any] = _card(models.json()["data"], self.config.adapter)
        except (
            httpx.HTTPError
        ) as e:  # unreachable, or /v1/models refused (e.g. 401: set upstream_api_key_env)
            return UpstreamReport(ready=False, error=f"poll failed: {type(e).__name__}: {e}")
        except AdapterNotLoaded as e:
            return UpstreamReport(ready=False, error=str(e))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return UpstreamReport(ready=False, error=f"/v1/models is not a model list: {e!r}")
        schema = card.get("embedding_schema")
        limit = card.get("max_model_len")
        return UpstreamReport(
            ready=True,
            schema=schema if isinstance(schema, str) else None,
            max_model_len=limit if isinstance(limit, int) else None,
            card=card,
        )

    def _apply(self, reports: dict[str, UpstreamReport]) -> None:
        for url, report in reports.items():
            self.upstreams[url].report = report
        if self.schema is None:
            self.schema = choose_schema(self.config.pools, reports)
            if self.schema is not None:
                log.info("gateway embedding_schema: %s", self.schema)
        self._refresh()

    def _refresh(self) -> None:
        for pool in self.pools.values():
            for u in pool.members:
                reason = exclusion(pool.config, self.schema, u.report)
                if reason != pool.reasons[u.url]:
                    _log_transition(pool.name, u.url, reason)
                pool.reasons[u.url] = reason

    # ---- request path ----------------------------------------------------------------------

    def mark_down(self, url: str, reason: str) -> None:
        """A request could not reach `url`: out of rotation until a poll finds it ready."""
        self.upstreams[url].report = UpstreamReport(ready=False, error=reason)
        self._refresh()

    def available(self) -> set[str]:
        return {name for name, pool in self.pools.items() if pool.in_rotation()}

    def model_card(self) -> dict[str, Any] | None:
        """The card of the first upstream in rotation (pools in config order)."""
        for pool in self.pools.values():
            for u in pool.in_rotation():
                return dict(u.report.card)
        return None

    def describe(self) -> dict[str, Any]:
        return {
            name: {
                "max_tokens": pool.config.max_tokens,
                "classes": sorted(pool.config.classes),
                "available": bool(pool.in_rotation()),
                "upstreams": {
                    u.url: {"in_rotation": pool.reasons[u.url] is None, "detail": pool.reasons[u.url] or "ok"}
                    for u in pool.members
                },
            }
            for name, pool in self.pools.items()
        }


def _log_transition(pool: str, url: str, reason: str | None) -> None:
    if reason is None:
        log.info("upstream %s is in rotation for pool %r", url, pool)
    elif reason.startswith("SCHEMA MISMATCH"):
        # Loud on purpose: a wrong model behind a pool would silently corrupt an index.
        log.error("!!! upstream %s in pool %r: %s", url, pool, reason)
    else:
        log.warning("upstream %s out of rotation for pool %r: %s", url, pool, reason)


class AdapterNotLoaded(Exception):
    """The upstream does not serve the LoRA adapter (yet): out of rotation for it until it does."""


def _card(cards: list[dict[str, Any]], adapter: str | None) -> dict[str, Any]:
    """The upstream's base model's card, or a LoRA adapter's."""
    if adapter is None:
        return cards[0]
    for card in cards:
        if card["id"] == adapter:
            return card
    listed = ", ".join(str(c.get("id")) for c in cards)
    raise AdapterNotLoaded(f"/v1/models lists no LoRA adapter {adapter!r} (it lists {listed})")
