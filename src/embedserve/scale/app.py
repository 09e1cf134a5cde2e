"""The Ray Serve application built from pools.yaml, and its declarative Serve config.

    HTTP ──> ingress (gateway routing) ──handle──> pool-short (1..N replicas, one Engine each)
                    │                      └─────> pool-long  (1..M replicas)
                    └── /metrics <── metrics-hub <── every replica's server metrics

`deployment_options` is the one place a pool becomes Serve options (replicas, custom autoscaling
policy, resources); both the Python application (`build_app`, `app_builder` for
`serve run embedserve.scale.app:app_builder config=pools.yaml`) and the declarative config
(`serve_config`, what deploy/k8s/rayservice.yaml embeds) use it, so they cannot drift.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, cast

from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from embedserve.scale.cluster_config import ClusterConfig, load_cluster_config, parse_cluster_config
from embedserve.scale.config import ScaleConfig, ServePool
from embedserve.scale.ingress_app import Ingress
from embedserve.scale.metrics import MetricsHub
from embedserve.scale.replica import PoolReplica

log = logging.getLogger(__name__)

APP_NAME = "embedserve"
IMPORT_PATH = "embedserve.scale.app:app_builder"
POLICY_PATH = "embedserve.scale.policy:QueuedTokensPolicy"
INGRESS = "ingress"
HUB = "metrics-hub"
INGRESS_MAX_ONGOING = 1024  # as `embedserve serve`'s limit_concurrency
# Used only when this Ray has no custom autoscaling policies (see `custom_policy_supported`).
FALLBACK_TARGET_ONGOING_REQUESTS = 4

# serve.deployment's overloads type a bare class as a decorator factory: hence the casts.
PoolDeployment = cast(Deployment, serve.deployment(PoolReplica))
IngressDeployment = cast(Deployment, serve.deployment(serve.ingress()(Ingress)))
HubDeployment = cast(Deployment, serve.deployment(MetricsHub))


def custom_policy_supported() -> bool:
    from ray.serve.config import AutoscalingConfig

    return "policy" in AutoscalingConfig.model_fields and hasattr(PoolReplica, "record_autoscaling_stats")


def deployment_options(pool: ServePool) -> dict[str, Any]:
    s = pool.scaling
    autoscaling: dict[str, Any] = {
        "min_replicas": s.min_replicas,
        "max_replicas": s.max_replicas,
        "initial_replicas": s.min_replicas,
        "metrics_interval_s": s.metrics_interval_s,
        "look_back_period_s": s.look_back_period_s,
    }
    if custom_policy_supported():
        # The policy applies the pool's delays itself; Ray's own delays would add to them.
        autoscaling |= {
            "upscale_delay_s": 0.0,
            "downscale_delay_s": 0.0,
            "policy": {
                "policy_function": POLICY_PATH,
                "policy_kwargs": {
                    "target_queued_tokens": s.target_queued_tokens,
                    "min_replicas": s.min_replicas,
                    "max_replicas": s.max_replicas,
                    "upscale_delay_s": s.upscale_delay_s,
                    "downscale_delay_s": s.downscale_delay_s,
                },
            },
        }
    else:
        warnings.warn(
            f"pool {pool.name!r}: this Ray has no custom autoscaling policies; scaling on "
            f"target_ongoing_requests={FALLBACK_TARGET_ONGOING_REQUESTS} instead of queued tokens",
            stacklevel=2,
        )
        autoscaling |= {
            "target_ongoing_requests": FALLBACK_TARGET_ONGOING_REQUESTS,
            "upscale_delay_s": s.upscale_delay_s,
            "downscale_delay_s": s.downscale_delay_s,
        }
    actor: dict[str, Any] = {"num_cpus": pool.num_cpus}
    if pool.num_gpus:
        actor["num_gpus"] = pool.num_gpus
    return {
        "name": pool.deployment,
        # Serve's default (5) would cap what one engine batches; its own admission (429 past
        # max_queued_tokens) is the backpressure, as on `embedserve serve`.
        "max_ongoing_requests": pool.engine.max_num_seqs,
        "autoscaling_config": autoscaling,
        "ray_actor_options": actor,
        # Warm-up runs in the constructor: allow for a slow model load.
        "health_check_period_s": 5.0,
        "graceful_shutdown_timeout_s": 30.0,
    }


def _light(name: str) -> dict[str, Any]:
    """The ingress and the hub: no engine, so no CPU reserved (they must not block replicas).
    The ingress takes every request at once (Serve's default of 5 would queue them in the proxy,
    first come first served, before the gateway's counting, quotas and fair share see them)."""
    options: dict[str, Any] = {"name": name, "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}
    if name == INGRESS:
        options["max_ongoing_requests"] = INGRESS_MAX_ONGOING
    return options


def build_app(config: ScaleConfig | ClusterConfig) -> Application:
    """The ingress over one deployment per pool of every model (handles by deployment name)."""
    cluster = ClusterConfig.of(config)
    hub = HubDeployment.options(**_light(HUB)).bind()
    handles = {
        p.deployment: PoolDeployment.options(**deployment_options(p)).bind(
            p, m.gateway.served_model_name, hub
        )
        for m in cluster.models
        for p in m.pools
    }
    return IngressDeployment.options(**_light(INGRESS)).bind(cluster, handles, hub)


def app_builder(args: dict[str, Any]) -> Application:
    """`serve run embedserve.scale.app:app_builder config=pools.yaml`, or the RayService's
    `args: {pools: <the pools.yaml mapping>}` (self-contained: no file needed on the cluster)."""
    if "pools" in args:
        return build_app(parse_cluster_config(args["pools"]))
    if "config" in args:
        return build_app(load_cluster_config(args["config"]))
    raise ValueError("app_builder needs args 'config' (a pools.yaml path) or 'pools' (its mapping)")


def serve_config(
    config: ScaleConfig | ClusterConfig, host: str = "0.0.0.0", port: int = 8000
) -> dict[str, Any]:
    """The declarative Serve config (`serve build` style) for this pools.yaml."""
    config = ClusterConfig.of(config)
    deployments = [_light(INGRESS), _light(HUB), *(deployment_options(p) for p in config.pools)]
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": IMPORT_PATH,
                "args": {"pools": config.raw},
                "deployments": deployments,
            }
        ],
    }
