"""What a running gateway serves, and its reload: `kill -HUP <gateway>` re-reads pools.yaml and
swaps models, aliases, pools, routes and tenants at once, without dropping a request:

- the new config is loaded and checked, its token counters loaded (a model directory already
  served is reused), its pools probed once, its tenants' keys read; any error leaves the running
  config in place (logged);
- then one swap: requests already running finish on what they started with (their pools, their
  tenant's quota), every later one sees the new config;
- the old pools' health polling stops; a model keeping its name keeps its metrics (the counters
  go on), and so do the tenants' metrics; a pool keeping its name in a model keeping its name
  keeps its fair-share gate (`max_inflight_tokens` resized at the swap: parts still in flight
  count, parts waiting keep their turn). A renamed model or pool starts a new gate.

Settings of the process itself (the port, keys given with --api-key, `upstream_api_key_env`,
`timeout_s` of the shared HTTP client, tracing) need a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from embedserve.gateway.fleet import Fleet
from embedserve.gateway.fleet_config import FleetConfig, load_fleet
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.forward import Forwarder
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.pools.upstreams import UpstreamSet
from embedserve.gateway.service import GatewayService
from embedserve.gateway.tenancy.tenants import Tenant, TenantMetrics, Tenants

if TYPE_CHECKING:
    from embedserve.tracing.otel import Tracing

log = logging.getLogger(__name__)


class Live:
    """The fleet and tenants requests are served with now; `swap` replaces both at once."""

    def __init__(self, fleet: Fleet, tenants: Tenants | None = None) -> None:
        self.fleet = fleet
        self.tenants = tenants

    @classmethod
    def of(cls, served: GatewayService | Fleet, tenants: Tenants | None = None) -> Live:
        """What a gateway of one model's service, or of a fleet of them, serves."""
        return cls(served if isinstance(served, Fleet) else Fleet([served]), tenants)

    def keys(self, own: tuple[str, ...]) -> tuple[str, ...]:
        """Every key a client may send: the gateway's own and the tenants'."""
        return own if self.tenants is None else (*own, *self.tenants.keys())

    def tenant_of(self, headers: Mapping[str, str], own: tuple[str, ...]) -> Tenant | None:
        """The tenant a request's key names: None without a tenants map or for one of the
        gateway's `own` keys (Tenants.of_request: 401 for any other key)."""
        tenants = self.tenants
        return None if tenants is None else tenants.of_request(headers, own)

    def swap(self, fleet: Fleet, tenants: Tenants | None) -> None:
        self.fleet, self.tenants = fleet, tenants


@dataclasses.dataclass
class Built:
    live: Live
    sets: list[UpstreamSet]  # each model's pools (their health polling)
    counters: dict[str, TokenCounter]  # by model directory, reused by a reload


async def build(
    config: FleetConfig,
    counter_for: Callable[[str | None], str],
    client: httpx.AsyncClient,
    tracing: Tracing | None,
    previous: Built | None = None,
) -> Built:
    """Every model's service over its started pools, and the tenants; `counter_for(model)`: the
    directory to count a model's tokens with; `previous`: what a reload replaces (its counters,
    per-model metrics and tenant metrics go on)."""
    counters = dict(previous.counters) if previous else {}
    sets: list[UpstreamSet] = []
    services = []
    watch: list[tuple[GatewayMetrics, UpstreamSet]] = []  # kept metrics, moved once swapped
    try:
        for model_config in config.models:
            path = counter_for(model_config.model)
            if path not in counters:
                counters[path] = await asyncio.to_thread(TokenCounter, path)
            kept = _kept(previous, model_config.served_model_name)
            old = kept.upstreams if kept is not None else None
            upstreams = UpstreamSet(model_config, client, old if isinstance(old, UpstreamSet) else None)
            sets.append(upstreams)
            await upstreams.start()  # refuses to start on mixed schemas (per model)
            metrics = kept.metrics if kept is not None else GatewayMetrics(upstreams)
            if kept is not None:
                watch.append((metrics, upstreams))
            forwarder = Forwarder(upstreams, metrics, model_config.balance, tracing)
            counter = counters[path]
            services.append(GatewayService(model_config, counter, upstreams, metrics, forwarder, tracing))
        fleet = Fleet(services, config.aliases)
        tenants = None
        if config.tenants:
            before = previous.live.tenants if previous else None
            metrics_t = before.metrics if before else TenantMetrics()
            tenants = Tenants(config.tenants, metrics_t, previous=before)
    except BaseException:
        for s in sets:
            await s.close()
        raise
    if previous is None:
        return Built(Live(fleet, tenants), sets, counters)
    previous.live.swap(fleet, tenants)
    for s in sets:
        s.apply_limits()  # a kept gate takes its new limit only now: a refused reload changes none
    for metrics, upstreams in watch:
        metrics.watch(upstreams)
    return Built(previous.live, sets, counters)


def _kept(previous: Built | None, name: str | None) -> GatewayService | None:
    """The running service whose metrics a reloaded model keeps: the same served name, or the
    one model of a single-model config that stays single."""
    if previous is None:
        return None
    fleet = previous.live.fleet
    if name is None:
        return fleet.default if fleet.single else None
    return fleet.by_name.get(name)


async def reload(
    path: str | Path,
    adjust: Callable[[FleetConfig], FleetConfig],
    counter_for: Callable[[str | None], str],
    client: httpx.AsyncClient,
    tracing: Tracing | None,
    current: Built,
) -> Built:
    """The gateway after a SIGHUP: the new config swapped in, or `current` unchanged when it
    cannot be loaded (logged)."""
    try:
        config = adjust(load_fleet(path))
        built = await build(config, counter_for, client, tracing, current)
    except Exception as e:
        log.error("reload of %s refused, still serving the previous config: %s", path, e)
        return current
    for s in current.sets:
        await s.close()  # requests still on the old pools finish; their polling stops
    names = ", ".join(m.served_model_name or "(one model)" for m in config.models)
    log.info("reloaded %s: models %s, %d tenants", path, names, len(config.tenants))
    return built
