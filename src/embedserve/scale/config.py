"""pools.yaml for `embedserve serve-cluster`: the gateway's pools and routes, where a pool names
the model its replicas run instead of the URLs of servers started by hand.

```yaml
model: /models/qwen3-embedding-0.6b          # every pool's model unless a pool sets its own (same one)
pools:
  short:
    max_tokens: 1024                          # routing limit, as for the gateway
    dtype: float32                            # engine options of each replica
    max_num_batched_tokens: 2048
    replicas: {min: 1, max: 4, target_queued_tokens: 8192, upscale_delay_s: 5, downscale_delay_s: 30}
    resources: {num_cpus: 2, num_gpus: 0}
  long:
    max_tokens: 16384
    replicas: {min: 1, max: 2, target_queued_tokens: 65536}
routes:
  - {class: online, order: [short, long]}
  - {class: batch,  order: [long]}
```

Everything the gateway validates (max_tokens, classes, schema pins, routes) is validated by the
gateway's own parser; this module only takes out the serving keys first. A pool's
`max_model_len` defaults to its `max_tokens` (a replica must accept whatever is routed to it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from embedserve.engine.options import OPTION_NAMES, EngineOptions, OptionError
from embedserve.gateway.pools.config import GatewayConfig, GatewayConfigError, parse_config, read_config
from embedserve.gateway.pools.fields import Key, key, key_names, read_fields, section

# Every engine option is a pool key (engine/options.py); the few a pool refuses say why there.
_SERVING_KEYS = {"model", "replicas", "resources", "warmup_lengths", "max_queued_tokens", *OPTION_NAMES}
# The gateway's parser wants upstream URLs; a Serve pool's single "upstream" is its deployment.
_PLACEHOLDER = "http://serve.invalid"


@dataclass(frozen=True)
class Scaling:
    """A pool's `replicas:` keys, each read by its declaration (gateway/pools/fields.py)."""

    min_replicas: int = key(1, "count", name="min")
    max_replicas: int = key(1, "positive_int", name="max")  # absent: at least min
    target_queued_tokens: int = key(8192, "positive_int")  # per replica: more queued adds replicas
    upscale_delay_s: float = key(5.0, "non_negative")
    downscale_delay_s: float = key(30.0, "non_negative")
    metrics_interval_s: float = key(1.0, "number")  # how often replicas report their queued tokens
    look_back_period_s: float = key(5.0, "number")  # the window those reports are averaged over


@dataclass(frozen=True)
class Resources:
    """A pool's `resources:` keys: what Ray reserves per replica."""

    num_cpus: float = key(1.0, "non_negative")
    num_gpus: float = key(0.0, "non_negative")


@dataclass(frozen=True)
class ServePool:
    name: str
    scope: str | None  # its model's served name in the many-model form (cluster_config.py)
    model: str
    engine: EngineOptions  # each replica's engine (max_model_len always set)
    scaling: Scaling
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    warmup_lengths: tuple[int, ...] | None = None
    max_queued_tokens: int | None = None

    @property
    def deployment(self) -> str:
        """Its Serve deployment: `pool-NAME`, or `pool-MODEL-NAME` with many models."""
        if self.scope is None:
            return f"pool-{self.name}"
        return f"pool-{_slug(self.scope)}-{self.name}"

    @property
    def label(self) -> str:
        """Its `pool` label on the replicas' metrics: NAME, or MODEL/NAME with many models."""
        return self.name if self.scope is None else f"{self.scope}/{self.name}"


def _slug(name: str) -> str:
    """A served model name as a deployment name's part (letters, digits, '-' and '_')."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


@dataclass(frozen=True)
class ScaleConfig:
    gateway: GatewayConfig  # pools' upstreams are ("serve:<deployment>",): the guard's report keys
    pools: tuple[ServePool, ...]
    model: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)  # as read: app args, manifests

    def pool(self, name: str) -> ServePool:
        return next(p for p in self.pools if p.name == name)


def load_scale_config(path: str | Path) -> ScaleConfig:
    return read_config(path, parse_scale_config)


def parse_scale_config(raw: object) -> ScaleConfig:
    """The single-model form (top-level `pools:`); scale/cluster_config.py reads every form."""
    if not isinstance(raw, dict) or not isinstance(raw.get("pools"), dict):
        raise GatewayConfigError("the config needs a 'pools' mapping")
    stripped, serving = split_pools(raw["pools"], "pools")
    return replace(attach(parse_config({**raw, "pools": stripped}), serving, raw.get("model")), raw=raw)


def split_pools(pools: dict[Any, Any], where: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A `pools:` mapping as the gateway's parser reads it (serving keys out, a placeholder
    upstream in) and each pool's serving keys."""
    stripped: dict[str, Any] = {}
    serving: dict[str, dict[str, Any]] = {}
    for name, body in pools.items():
        if not isinstance(body, dict):
            raise GatewayConfigError(f"{where}.{name}: expected a mapping")
        if "upstreams" in body:
            raise GatewayConfigError(
                f"{where}.{name}: serve-cluster pools give 'model:' (run by Ray Serve), not 'upstreams:'"
            )
        serving[str(name)] = {k: v for k, v in body.items() if k in _SERVING_KEYS}
        stripped[str(name)] = {
            **{k: v for k, v in body.items() if k not in _SERVING_KEYS},
            "upstreams": [_PLACEHOLDER],
        }
    return stripped, serving


def attach(
    gateway: GatewayConfig,
    serving: dict[str, dict[str, Any]],
    default_model: object,
    scope: str | None = None,
) -> ScaleConfig:
    """One model's gateway config with its pools run by Serve: each pool's replicas and
    engine, its single "upstream" its deployment (`scope`: the model's entry in a `models:`
    map, which names its deployments)."""
    where = "pools" if scope is None else f"models.{scope}.pools"
    pools = tuple(
        _pool(p.name, p.max_tokens, serving[p.name], default_model, where, scope) for p in gateway.pools
    )
    models = {p.model for p in pools}
    if len(models) > 1:
        # One token counter and one embedding schema per model (embedserve.gateway.pools.guard).
        raise GatewayConfigError(
            f"{where}: pools name different models {sorted(models)}: a served model is one model"
        )
    gateway = replace(
        gateway,
        model=pools[0].model,
        pools=tuple(
            replace(g, upstreams=(f"serve:{p.deployment}",))
            for g, p in zip(gateway.pools, pools, strict=True)
        ),
    )
    return ScaleConfig(gateway=gateway, pools=pools, model=pools[0].model, raw={})


def resolve_model(model: str) -> str:
    """A pool's `model:` read like --model (the bundled default model by its name)."""
    from embedserve.models.default import model_argument

    return model_argument(model)


def _pool(
    name: str, max_tokens: int, body: dict[str, Any], default_model: object, within: str, scope: str | None
) -> ServePool:
    where = f"{within}.{name}"
    model = body.get("model", default_model)
    if scope is not None and model != default_model:  # a models: entry counts with its own model
        raise GatewayConfigError(
            f"{where}.model: {model!r} is not its entry's model {default_model!r}: a served model is "
            "one model (set it once, on the entry)"
        )
    if not isinstance(model, str) or not model:
        raise GatewayConfigError(f"{where}: no model: set 'model:' on the pool or at the top")
    try:
        given = {k: v for k, v in body.items() if k in OPTION_NAMES}
        engine = EngineOptions.from_mapping(given, where=where, surface="pools")
    except OptionError as e:
        raise GatewayConfigError(str(e)) from None
    if engine.max_model_len is None:
        engine = engine.replace(max_model_len=max_tokens)
    elif engine.max_model_len < max_tokens:
        raise GatewayConfigError(
            f"{where}.max_model_len {engine.max_model_len} is below max_tokens {max_tokens}: "
            "the replicas would refuse inputs routed to them"
        )
    scaling = _scaling(body.get("replicas", {}), f"{where}.replicas")
    within_resources = f"{where}.resources"
    raw_resources = section(body.get("resources", {}), within_resources, key_names(Resources))
    resources = Resources(**read_fields(Resources, raw_resources, within_resources))
    warmup = body.get("warmup_lengths")
    if warmup is not None and (
        not isinstance(warmup, list) or not all(isinstance(n, int) and n > 0 for n in warmup)
    ):
        raise GatewayConfigError(f"{where}.warmup_lengths: expected a list of positive integers")
    queued = body.get("max_queued_tokens")
    return ServePool(
        name=name,
        scope=scope,
        model=model,
        engine=engine,
        scaling=scaling,
        num_cpus=resources.num_cpus,
        num_gpus=resources.num_gpus,
        warmup_lengths=tuple(warmup) if warmup is not None else None,
        max_queued_tokens=Key("positive_int", optional=True).read(queued, f"{where}.max_queued_tokens"),
    )


def _scaling(raw: object, where: str) -> Scaling:
    values = read_fields(Scaling, section(raw, where, key_names(Scaling)), where)
    lo = values.get("min_replicas", Scaling.min_replicas)
    hi = values.setdefault("max_replicas", max(lo, Scaling.max_replicas))
    if hi < lo:
        raise GatewayConfigError(f"{where}: max ({hi}) is below min ({lo})")
    return Scaling(**values)
