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

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.gateway.pools.config import TRAFFIC_CLASSES, GatewayConfigError

_KEYS = {
    "api_keys_env",
    "api_keys_file",
    "models",
    "classes",
    "tokens_per_minute",
    "requests_per_minute",
    "max_concurrent_requests",
    "weight",
}


@dataclass(frozen=True)
class TenantConfig:
    name: str
    api_keys_env: str | None
    models: frozenset[str] | None = None  # None: every model
    classes: frozenset[str] = frozenset(TRAFFIC_CLASSES)
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    weight: float = 1.0
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
    if not isinstance(raw, dict):
        raise GatewayConfigError(f"{where}: expected a mapping with keys {sorted(_KEYS)}")
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise GatewayConfigError(f"{where}: unknown keys {unknown}; allowed: {sorted(_KEYS)}")
    env, file = raw.get("api_keys_env"), raw.get("api_keys_file")
    if (env is None) == (file is None):
        raise GatewayConfigError(f"{where}: give its keys' api_keys_env (a variable) or api_keys_file")
    for key, value in (("api_keys_env", env), ("api_keys_file", file)):
        if value is not None and (not isinstance(value, str) or not value):
            raise GatewayConfigError(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return TenantConfig(
        name=name,
        api_keys_env=env,
        api_keys_file=file,
        models=_names(raw, "models", where, models) if "models" in raw else None,
        classes=_names(raw, "classes", where, set(TRAFFIC_CLASSES))
        if "classes" in raw
        else frozenset(TRAFFIC_CLASSES),
        tokens_per_minute=_count(raw, "tokens_per_minute", where),
        requests_per_minute=_count(raw, "requests_per_minute", where),
        max_concurrent_requests=_count(raw, "max_concurrent_requests", where),
        weight=_weight(raw.get("weight", 1.0), where),
    )


def _names(raw: dict[str, Any], key: str, where: str, allowed: set[str]) -> frozenset[str]:
    value = raw[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise GatewayConfigError(f"{where}.{key}: expected a non-empty list of names")
    unknown = sorted(v for v in value if allowed and v not in allowed)
    if unknown:
        raise GatewayConfigError(f"{where}.{key}: unknown {unknown}; known: {sorted(allowed)}")
    return frozenset(value)


def _count(raw: dict[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GatewayConfigError(f"{where}.{key}: expected a positive integer, got {value!r}")
    return value


def _weight(value: object, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    raise GatewayConfigError(f"{where}.weight: expected a positive number, got {value!r}")
