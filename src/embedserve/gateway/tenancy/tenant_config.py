"""pools.yaml's `tenants:` map: who may call the gateway and how much.

```yaml
tenants:
  acme:
    api_keys_env: ACME_KEYS          # the variable holding its comma-separated keys (never the file),
    # or api_keys_file: /run/secrets/acme   (keys separated by commas or lines; read again at
    #                                        each reload: rotate a key without a restart)
    models: [minilm-v2]              # served models (or aliases) it may use; default: all
    classes: [online]                # traffic classes it may use; default: both
    tokens_per_minute: 200000        # quotas, refilled continuously; default: none
    requests_per_minute: 600
    max_concurrent_requests: 16
    weight: 3                        # its share when tenants contend (default 1)
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.gateway.pools.config import TRAFFIC_CLASSES, GatewayConfigError
from embedserve.gateway.pools.fields import Key, key, key_names, read_fields, section


@dataclass(frozen=True)
class TenantConfig:
    name: str
    api_keys_env: str | None
    models: frozenset[str] | None = None  # None: every model
    classes: frozenset[str] = frozenset(TRAFFIC_CLASSES)
    # quotas and share, each read by its declaration (gateway/pools/fields.py)
    tokens_per_minute: int | None = key(None, "positive_int", optional=True)
    requests_per_minute: int | None = key(None, "positive_int", optional=True)
    max_concurrent_requests: int | None = key(None, "positive_int", optional=True)
    weight: float = key(1.0, "weight")
    api_keys_file: str | None = None

    def api_keys(self) -> tuple[str, ...]:
        """Its keys from the environment or the file; none is a startup (or reload) error."""
        if self.api_keys_file is not None:
            where = f"tenants.{self.name}.api_keys_file: {self.api_keys_file}"
            try:
                value = Path(self.api_keys_file).read_text(encoding="utf-8")
            except OSError as e:
                raise GatewayConfigError(f"{where}: cannot be read ({e.strerror})") from None
        else:
            where = f"tenants.{self.name}.api_keys_env: ${self.api_keys_env}"
            value = os.environ.get(self.api_keys_env or "", "")
        keys = tuple(dict.fromkeys(k.strip() for k in value.replace("\n", ",").split(",") if k.strip()))
        if not keys:
            raise GatewayConfigError(f"{where} holds no key")
        return keys


def parse_tenants(raw: object, models: set[str]) -> tuple[TenantConfig, ...]:
    """`models`: the names a tenant's `models:` may list (served names and aliases; empty: the
    single-model form, where any name is checked by the model itself)."""
    if not isinstance(raw, dict) or not raw:
        raise GatewayConfigError("tenants: expected a non-empty mapping of tenant name -> settings")
    return tuple(_tenant(str(name), body, models) for name, body in raw.items())


def _tenant(name: str, raw: object, models: set[str]) -> TenantConfig:
    where = f"tenants.{name}"
    allowed = {"api_keys_env", "api_keys_file", "models", "classes", *key_names(TenantConfig)}
    if not isinstance(raw, dict):
        raise GatewayConfigError(f"{where}: expected a mapping with keys {sorted(allowed)}")
    section(raw, where, allowed)
    env, file = raw.get("api_keys_env"), raw.get("api_keys_file")
    if (env is None) == (file is None):
        raise GatewayConfigError(f"{where}: give its keys' api_keys_env (a variable) or api_keys_file")
    text = Key("text", optional=True)
    for name_of, value in (("api_keys_env", env), ("api_keys_file", file)):
        text.read(value, f"{where}.{name_of}")
    return TenantConfig(
        name=name,
        api_keys_env=env,
        api_keys_file=file,
        models=_names(raw, "models", where, models) if "models" in raw else None,
        classes=_names(raw, "classes", where, set(TRAFFIC_CLASSES))
        if "classes" in raw
        else frozenset(TRAFFIC_CLASSES),
        **read_fields(TenantConfig, raw, where),
    )


def _names(raw: dict[str, Any], key: str, where: str, allowed: set[str]) -> frozenset[str]:
    value = raw[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise GatewayConfigError(f"{where}.{key}: expected a non-empty list of names")
    unknown = sorted(v for v in value if allowed and v not in allowed)
    if unknown:
        raise GatewayConfigError(f"{where}.{key}: unknown {unknown}; known: {sorted(allowed)}")
    return frozenset(value)
