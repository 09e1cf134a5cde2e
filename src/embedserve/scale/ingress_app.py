"""The ingress deployment (wrapped by app.py): `embedserve gateway`'s app over every model's pool
deployments (scale/ingress.py), with the same models, aliases and tenants (gateway/fleet.py,
gateway/tenancy/tenants.py): routing by each request's `model`, per-tenant keys, quotas and fair share
by tokens at each pool's `max_inflight_tokens`.

A Serve application changes by being deployed again (`serve deploy`, or a new RayService
spec), so there is no SIGHUP reload here: Serve starts the new ingress and pools beside the old
ones and moves traffic once they are healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from embedserve.gateway.fleet import Fleet
from embedserve.gateway.live import Live
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.gateway.pools.metrics import GatewayMetrics
from embedserve.gateway.service import GatewayService
from embedserve.gateway.tenancy.tenants import Tenants
from embedserve.scale.cluster_config import ClusterConfig
from embedserve.scale.config import ScaleConfig, resolve_model
from embedserve.scale.ingress import ServePools, ServeRunner
from embedserve.scale.metrics import ReplicaCollector


async def serve_gateway(
    config: ScaleConfig, handles: Mapping[str, Any], counter: TokenCounter
) -> tuple[GatewayService, ServePools]:
    """One model's gateway service over its pool deployments (`handles`: pool name -> handle)."""
    pools = ServePools(config, handles)
    await pools.start()
    metrics = GatewayMetrics(None)
    return GatewayService(config.gateway, counter, pools, metrics, ServeRunner(pools, metrics)), pools


async def serve_fleet(
    config: ScaleConfig | ClusterConfig,
    handles: Mapping[str, Any],
    counter_for: Callable[[str], TokenCounter] | None = None,
) -> tuple[Live, list[ServePools]]:
    """Every model's service (`handles`: deployment name -> handle; `counter_for(model)`: its
    token counter, one per model directory) and the tenants, as the gateway serves them."""
    cluster = ClusterConfig.of(config)
    load = counter_for or (lambda model: TokenCounter(resolve_model(model)))
    counters: dict[str, TokenCounter] = {}
    services, directories = [], []
    for model in cluster.models:
        if model.model not in counters:
            counters[model.model] = await asyncio.to_thread(load, model.model)
        own = {p.name: handles[p.deployment] for p in model.pools}
        service, pools = await serve_gateway(model, own, counters[model.model])
        services.append(service)
        directories.append(pools)
    tenants = Tenants(cluster.tenants) if cluster.tenants else None
    return Live(Fleet(services, cluster.aliases), tenants), directories


def own_keys(config: ClusterConfig) -> tuple[str, ...]:
    """The gateway's own clients' keys ($EMBEDSERVE_GATEWAY_API_KEY, the config's api_keys_env)
    in the ingress's environment (Ray's runtime_env, the pods' env on Kubernetes)."""
    from embedserve.gateway.cli import client_api_keys

    return client_api_keys(None, config.models[0].gateway.api_keys_env)


class Ingress:
    async def __init__(self, config: ClusterConfig, handles: dict[str, Any], hub: Any) -> None:  # type: ignore[misc]  # Serve awaits it
        from embedserve.gateway.app import create_app

        live, self.directories = await serve_fleet(config, handles)
        self.replica_metrics = ReplicaCollector()
        live.fleet.registry.register(self.replica_metrics)
        self._app = create_app(live, own_keys(config))
        self._hub = hub
        self._interval = min(m.gateway.health_interval_s for m in config.models)
        self._poller = asyncio.create_task(self._poll_forever())

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for pools in self.directories:
                with contextlib.suppress(Exception):
                    await pools.poll()
            with contextlib.suppress(Exception):
                self.replica_metrics.snapshots = await self._hub.snapshots.remote()
