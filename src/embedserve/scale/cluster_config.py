"""pools.yaml for `embedserve serve-cluster` in every form the gateway reads: one model (top-level
`pools:`, scale/config.py), or a `models:` map with `aliases:`, and optionally `tenants:`, as
`embedserve gateway` reads them (gateway/fleet_config.py, gateway/tenancy/tenant_config.py), where each
model's pools give the serving keys of scale/config.py instead of upstream URLs:

```yaml
models:
  qwen3-embedding-v1:
    model: /models/qwen3-embedding-0.6b
    pools:
      short: {max_tokens: 1024, replicas: {min: 1, max: 4}, max_inflight_tokens: 8192}
      long:  {max_tokens: 16384}
    routes: [{class: online, order: [short, long]}, {class: batch, order: [long]}]
  minilm:
    model: all-MiniLM-L6-v2
    pools: {all: {max_tokens: 512}}
    routes: [{class: online, order: [all]}, {class: batch, order: [all]}]
aliases: {embed-latest: qwen3-embedding-v1}
tenants:
  acme: {api_keys_env: ACME_KEYS, weight: 3, tokens_per_minute: 200000}
```

Each pool becomes its own deployment, `pool-MODEL-NAME` (`pool-NAME` in the single-model form);
the gateway's parsers validate everything they read (models, aliases, routes, tenants), so the
two commands accept the same file shapes and refuse with the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.gateway.fleet_config import parse_fleet
from embedserve.gateway.pools.config import GatewayConfigError, read_config
from embedserve.gateway.tenancy.tenant_config import TenantConfig
from embedserve.scale.config import ScaleConfig, ServePool, attach, split_pools


@dataclass(frozen=True)
class ClusterConfig:
    models: tuple[ScaleConfig, ...]
    aliases: dict[str, str] = field(default_factory=dict)
    tenants: tuple[TenantConfig, ...] = ()
    raw: dict[str, Any] = field(repr=False, default_factory=dict)  # as read: app args, manifests

    @classmethod
    def of(cls, config: ScaleConfig | ClusterConfig) -> ClusterConfig:
        """A single-model config as the one model of a cluster (no aliases, no tenants)."""
        if isinstance(config, ClusterConfig):
            return config
        return cls((config,), raw=config.raw)

    @property
    def single(self) -> bool:
        return len(self.models) == 1 and self.models[0].gateway.served_model_name is None

    @property
    def pools(self) -> tuple[ServePool, ...]:
        """Every model's pools: one deployment each."""
        return tuple(p for m in self.models for p in m.pools)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    return read_config(path, parse_cluster_config)


def parse_cluster_config(raw: object) -> ClusterConfig:
    if not isinstance(raw, dict):
        raise GatewayConfigError("the config needs a 'pools' mapping or a 'models' map")
    if "models" not in raw:
        pools = raw.get("pools")
        if not isinstance(pools, dict):
            raise GatewayConfigError("the config needs a 'pools' mapping or a 'models' map")
        stripped, serving = split_pools(pools, "pools")
        fleet = parse_fleet({**raw, "pools": stripped})
        one = attach(fleet.first(), serving, raw.get("model"))
        return _checked(ClusterConfig((one,), fleet.aliases, fleet.tenants, raw))
    entries, bodies = raw["models"], {}
    every: dict[str, dict[str, dict[str, Any]]] = {}
    if isinstance(entries, dict):
        for name, body in entries.items():
            if isinstance(body, dict) and isinstance(body.get("pools"), dict):
                stripped, every[str(name)] = split_pools(body["pools"], f"models.{name}.pools")
                body = {**body, "pools": stripped}
            bodies[name] = body
    fleet = parse_fleet({**raw, "models": bodies or entries})
    models = tuple(
        attach(m, every[str(m.served_model_name)], m.model, m.served_model_name) for m in fleet.models
    )
    return _checked(ClusterConfig(models, fleet.aliases, fleet.tenants, raw))


def _checked(config: ClusterConfig) -> ClusterConfig:
    """Deployment names are unique (a model's name is slugged into them)."""
    seen: dict[str, str] = {}
    for p in config.pools:
        other = seen.setdefault(p.deployment, p.label)
        if other != p.label:
            raise GatewayConfigError(
                f"pools {other!r} and {p.label!r} would both deploy as {p.deployment!r}: rename one"
            )
    return config
