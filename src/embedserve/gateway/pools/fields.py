"""One typed reader for pools.yaml's sections (#62): a key is a dataclass field declared with
`key(default, kind)`, and `read_fields` reads every declared key a section holds, checked by its
kind, each error naming the key as `where.key`. The gateway's top level and pools
(gateway/pools/config.py), tenants (gateway/tenancy/tenant_config.py) and a Ray pool's replicas
and resources (scale/config.py) are read with it; a section's allowed keys are its declared ones
(`section`), so a new key is one field declaration.

Kinds (the errors each gives, unchanged from the hand-written checks they replace):

    positive_int   an integer >= 1            "expected a positive integer, got V"
    count          an integer >= 0            (the same words: a replica minimum may be 0)
    seconds        a finite number > 0        "expected a positive number of seconds, got V"
    weight         a finite number > 0        "expected a positive number, got V"
    number         a finite number > 0        "expected a number, got V" / "expected a positive number"
    non_negative   a finite number >= 0       "expected a number, got V" / "... a non-negative number"
    text           a non-empty string         "expected a non-empty string, got V"
    choice         one of `choices`           "expected one of [...], got V"

`optional`: a null value reads as None instead of being refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embedserve.errors import EmbedServeError

_NUMBERS = ("seconds", "weight", "number", "non_negative")


class GatewayConfigError(EmbedServeError):
    """The gateway cannot run with this configuration (the message names the key and why)."""


@dataclass(frozen=True)
class Key:
    kind: str
    name: str | None = None  # the YAML key where it differs from the field's name
    choices: tuple[str, ...] = ()
    optional: bool = False

    def read(self, value: object, where: str) -> Any:
        if value is None and self.optional:
            return None
        if self.kind == "text":
            if not isinstance(value, str) or not value:
                raise GatewayConfigError(f"{where}: expected a non-empty string, got {value!r}")
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise GatewayConfigError(f"{where}: expected one of {list(self.choices)}, got {value!r}")
            return str(value)
        if self.kind in ("positive_int", "count"):
            least = 1 if self.kind == "positive_int" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise GatewayConfigError(f"{where}: expected a positive integer, got {value!r}")
            return value
        assert self.kind in _NUMBERS, self.kind
        return _number(self.kind, value, where)


def _number(kind: str, value: object, where: str) -> float:
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind in ("seconds", "weight"):
        if not finite or not value > 0:  # type: ignore[operator]
            what = "a positive number of seconds" if kind == "seconds" else "a positive number"
            raise GatewayConfigError(f"{where}: expected {what}, got {value!r}")
        return float(value)  # type: ignore[arg-type]
    if not finite:
        raise GatewayConfigError(f"{where}: expected a number, got {value!r}")
    zero = kind == "non_negative"
    if value < 0 or (value == 0 and not zero):  # type: ignore[operator]
        raise GatewayConfigError(f"{where}: expected a {'non-negative' if zero else 'positive'} number")
    return float(value)  # type: ignore[arg-type]


def key(default: Any, kind: str, **options: Any) -> Any:
    """A dataclass field read from pools.yaml by `read_fields` (options: Key's)."""
    return dataclasses.field(default=default, metadata={"key": Key(kind, **options)})


def declared(cls: type) -> dict[str, Key]:
    """The YAML keys of `cls`'s declared fields, by field name."""
    return {f.name: f.metadata["key"] for f in dataclasses.fields(cls) if "key" in f.metadata}


def key_names(cls: type) -> set[str]:
    return {k.name or name for name, k in declared(cls).items()}


def read_fields(cls: type, body: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Every declared key of `cls` that `body` holds, checked, by field name (absent ones keep
    their defaults); `where`: the section's path ("" at the top level)."""
    out = {}
    for name, k in declared(cls).items():
        yaml_key = k.name or name
        if yaml_key in body:
            out[name] = k.read(body[yaml_key], f"{where}.{yaml_key}" if where else yaml_key)
    return out


def section(raw: object, where: str, allowed: set[str] | None) -> dict[str, Any]:
    """A mapping whose keys are all `allowed` (None: any): a typo ("max_token") must not silently
    fall back to a default."""
    if not isinstance(raw, dict):
        raise GatewayConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    if allowed is None:
        return raw
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise GatewayConfigError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return raw
