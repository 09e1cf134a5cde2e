"""pools.yaml with many models: a `models:` map, one entry per served model name (what clients
send as `model`), each with its own model directory, pools and routes; `aliases:` maps other
names to them (a cutover is a config change, not a client change).

```yaml
models:
  qwen3-embedding-v1:
    model: /models/qwen3-embedding-0.6b            # tokenizer + prompts to count its tokens
    pools:
      short: {max_tokens: 4096,  upstreams: ["http://127.0.0.1:8001"]}
      long:  {max_tokens: 16384, upstreams: ["http://127.0.0.1:8002"]}
    routes:
      - {class: online, order: [short, long]}
      - {class: batch,  order: [long]}
  minilm:
    model: all-MiniLM-L6-v2
    pools: {all: {max_tokens: 512, upstreams: ["http://127.0.0.1:8003"]}}
    routes: [{class: online, order: [all]}, {class: batch, order: [all]}]
    adapters: [legal, medical]   # LoRA adapters its pools serve (--lora-modules): served names too
aliases: {embed-latest: qwen3-embedding-v1}
# the other top-level keys of gateway/pools/config.py (balance, timeouts, limits, keys) apply to all
```

The single-model form (`pools:` and `routes:` at the top) stays valid: one entry, named as its
upstreams or `served_model_name` name it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from embedserve.gateway.pools.config import GatewayConfig, GatewayConfigError, parse_config, read_config
from embedserve.gateway.tenancy.tenant_config import TenantConfig, parse_tenants

# What a `models:` entry may set; every other gateway key is set once, at the top.
_MODEL_KEYS = ("model", "pools", "routes", "adapters")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@")


@dataclass(frozen=True)
class FleetConfig:
    """One GatewayConfig per served model (its `served_model_name` is the entry's name; None in
    the single-model form, where the upstreams name it), and aliases: other name -> served name."""

    models: tuple[GatewayConfig, ...]
    aliases: dict[str, str]
    tenants: tuple[TenantConfig, ...] = ()  # none: no tenants, the gateway's own keys (if any)

    @property
    def single(self) -> bool:
        return len(self.models) == 1 and self.models[0].served_model_name is None

    def first(self) -> GatewayConfig:
        return self.models[0]


def load_fleet(path: str | Path) -> FleetConfig:
    return read_config(path, parse_fleet)


def parse_fleet(raw: object) -> FleetConfig:
    fleet = _models(raw)
    if not isinstance(raw, dict) or "tenants" not in raw:
        return fleet
    names = {m.served_model_name for m in fleet.models if m.served_model_name} | set(fleet.aliases)
    return FleetConfig(fleet.models, fleet.aliases, parse_tenants(raw["tenants"], names))


def _models(raw: object) -> FleetConfig:
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k != "tenants"}
    if not isinstance(raw, dict) or "models" not in raw:
        if isinstance(raw, dict) and "aliases" in raw:
            raise GatewayConfigError("aliases: name models of a 'models:' map (none is defined)")
        return FleetConfig((parse_config(raw),), {})
    shared = {k: v for k, v in raw.items() if k not in ("models", "aliases")}
    for key in ("pools", "routes", "model", "served_model_name"):
        if key in shared:
            raise GatewayConfigError(
                f"{key}: with a 'models:' map, each model sets its own (models.NAME.{key})"
                if key != "served_model_name"
                else "served_model_name: with a 'models:' map, each entry's name is its served name"
            )
    entries = raw["models"]
    if not isinstance(entries, dict) or not entries:
        raise GatewayConfigError("models: expected a non-empty mapping of served model name -> entry")
    models = tuple(m for name, body in entries.items() for m in _model(str(name), body, shared))
    names = [m.served_model_name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1 and n is not None})
    if twice:
        raise GatewayConfigError(f"models: {twice} named twice (a model's name or one of its adapters')")
    return FleetConfig(models, _aliases(raw.get("aliases", {}), {m.served_model_name or "" for m in models}))


def _model(name: str, body: object, shared: dict[str, Any]) -> list[GatewayConfig]:
    """The entry's model, then one model per LoRA adapter its pools serve (the same pools and
    routes, counted with the same tokenizer; each with its own schema guard)."""
    where = f"models.{name}"
    if not name or not set(name) <= _NAME_CHARS:
        raise GatewayConfigError(f"{where}: a served model name is letters, digits and -_.:/@, got {name!r}")
    if not isinstance(body, dict):
        raise GatewayConfigError(f"{where}: expected a mapping with {list(_MODEL_KEYS)}")
    unknown = sorted(str(k) for k in body if k not in _MODEL_KEYS)
    if unknown:
        raise GatewayConfigError(
            f"{where}: unknown keys {unknown}; a model sets {list(_MODEL_KEYS)}, the rest is set at the top"
        )
    if "model" not in body:
        raise GatewayConfigError(f"{where}: missing 'model' (the directory its tokens are counted with)")
    adapters = body.get("adapters", [])
    if not isinstance(adapters, list) or not all(
        isinstance(a, str) and set(a) <= _NAME_CHARS and a for a in adapters
    ):
        raise GatewayConfigError(
            f"{where}.adapters: expected a list of adapter names (letters, digits, -_.:/@)"
        )
    try:
        base = parse_config(
            {**shared, **{k: v for k, v in body.items() if k != "adapters"}, "served_model_name": name}
        )
    except GatewayConfigError as e:
        raise GatewayConfigError(f"{where}: {e}") from None
    # an adapter's schema is its own: a pool's `schema:` pin names the base model's
    pools = tuple(replace(p, schema=None) for p in base.pools)
    return [base, *(replace(base, served_model_name=a, adapter=a, pools=pools) for a in adapters)]


def _aliases(raw: object, served: set[str]) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise GatewayConfigError(f"aliases: expected a mapping of alias -> served model name, got {raw!r}")
    aliases: dict[str, str] = {}
    for alias, target in raw.items():
        if not isinstance(alias, str) or not alias or not set(alias) <= _NAME_CHARS:
            raise GatewayConfigError(f"aliases: an alias is letters, digits and -_.:/@, got {alias!r}")
        if alias in served:
            raise GatewayConfigError(f"aliases.{alias}: is already a served model's name")
        if target not in served:
            raise GatewayConfigError(
                f"aliases.{alias}: {target!r} is not a served model; models: {sorted(served)}"
            )
        aliases[alias] = str(target)
    return aliases
