"""pools.yaml -> frozen dataclasses, validated with errors that name the offending key.

```yaml
model: /models/qwen3-embedding-0.6b     # tokenizer + prompts used to count tokens (or --model)
pools:
  short: {max_tokens: 4096,  upstreams: ["http://127.0.0.1:8001"], classes: [online, batch]}
  long:  {max_tokens: 16384, upstreams: ["http://127.0.0.1:8002"], classes: [online, batch]}
  batch-long: {max_tokens: 16384, upstreams: ["http://127.0.0.1:8003"], classes: [batch],
               schema: es1-0123456789abcdef}  # optional pin; else the first upstream's schema
# a pool's optional max_inflight_tokens: tokens in flight to it at most; more wait, shared fairly
# by tenants' weights (gateway/pools/fair.py)
routes:
  - {class: online, order: [short, long]}
  - {class: batch,  order: [batch-long, long]}
# optional: served_model_name, balance (least_tokens | round_robin), health_interval_s,
# timeout_s (one upstream call), request_timeout_s (end-to-end deadline of a client request, at
# most timeout_s; passed down as X-Request-Timeout), max_inputs_per_request, max_body_bytes,
# upstream_api_key_env (key sent to the pools), api_keys_env (keys the gateway's own clients
# must send, comma-separated in that variable)
```
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from embedserve.errors import EmbedServeError

T = TypeVar("T")
TRAFFIC_CLASSES = ("online", "batch")
BALANCE_POLICIES = ("least_tokens", "round_robin")

_TOP_KEYS = {
    "model",
    "served_model_name",
    "pools",
    "routes",
    "balance",
    "health_interval_s",
    "timeout_s",
    "request_timeout_s",
    "api_keys_env",
    "max_inputs_per_request",
    "max_body_bytes",
    "upstream_api_key_env",
}
_POOL_KEYS = {"max_tokens", "upstreams", "classes", "schema", "max_inflight_tokens"}
_ROUTE_KEYS = {"class", "order"}


class GatewayConfigError(EmbedServeError):
    """The gateway cannot run with this configuration (the message names the key and why)."""


@dataclass(frozen=True)
class PoolConfig:
    name: str
    max_tokens: int
    upstreams: tuple[str, ...]  # base URLs without a trailing "/" or "/v1"
    classes: frozenset[str]
    schema: str | None = None  # pinned embedding_schema
    # Tokens the gateway keeps in flight to the pool; more wait, in fair order (gateway/pools/fair.py).
    max_inflight_tokens: int | None = None


@dataclass(frozen=True)
class RouteConfig:
    traffic_class: str
    order: tuple[str, ...]  # pool names: fallback order


@dataclass(frozen=True)
class GatewayConfig:
    pools: tuple[PoolConfig, ...]
    routes: tuple[RouteConfig, ...]
    model: str | None = None
    served_model_name: str | None = None
    balance: str = "least_tokens"
    health_interval_s: float = 2.0
    timeout_s: float = 600.0
    max_inputs_per_request: int = 2048
    max_body_bytes: int = 32 << 20
    upstream_api_key_env: str | None = None
    request_timeout_s: float | None = None  # None: timeout_s
    api_keys_env: str | None = None
    adapter: str | None = None  # a LoRA adapter the pools serve on `model` (its card's id, its `model`)

    @property
    def deadline_s(self) -> float:
        """Seconds a client request may take end to end (queueing in the pools included)."""
        return self.timeout_s if self.request_timeout_s is None else self.request_timeout_s

    def pool(self, name: str) -> PoolConfig:
        return next(p for p in self.pools if p.name == name)

    def route(self, traffic_class: str) -> RouteConfig | None:
        return next((r for r in self.routes if r.traffic_class == traffic_class), None)

    def limits(self) -> dict[str, int]:
        return {p.name: p.max_tokens for p in self.pools}


def load_config(path: str | Path) -> GatewayConfig:
    return read_config(path, parse_config)


def read_config(path: str | Path, parse: Callable[[object], T]) -> T:
    """pools.yaml read and parsed by `parse`; every error names the file."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise GatewayConfigError(f"cannot read gateway config {path}: {e}") from None
    except yaml.YAMLError as e:
        raise GatewayConfigError(f"gateway config {path} is not valid YAML: {e}") from None
    try:
        return parse(raw)
    except GatewayConfigError as e:
        raise GatewayConfigError(f"{path}: {e}") from None


def parse_config(raw: object) -> GatewayConfig:
    top = _mapping(raw, "the config", _TOP_KEYS)
    if "pools" not in top or "routes" not in top:
        raise GatewayConfigError("the config needs both 'pools' and 'routes'")
    pools = tuple(_pool(str(name), body) for name, body in _mapping(top["pools"], "pools", None).items())
    if not pools:
        raise GatewayConfigError("pools: define at least one pool")
    if not isinstance(top["routes"], list) or not top["routes"]:
        raise GatewayConfigError("routes: expected a non-empty list of {class, order} entries")
    known = {p.name: p for p in pools}
    routes = tuple(_route(i, r, known) for i, r in enumerate(top["routes"]))
    _check_routes(routes, pools)
    defaults = GatewayConfig(pools=(), routes=())
    return GatewayConfig(
        pools=pools,
        routes=routes,
        model=_opt_str(top, "model"),
        served_model_name=_opt_str(top, "served_model_name"),
        balance=_choice(top.get("balance", defaults.balance), "balance", BALANCE_POLICIES),
        health_interval_s=_positive_float(
            top.get("health_interval_s", defaults.health_interval_s), "health_interval_s"
        ),
        timeout_s=_positive_float(top.get("timeout_s", defaults.timeout_s), "timeout_s"),
        max_inputs_per_request=_positive_int(
            top.get("max_inputs_per_request", defaults.max_inputs_per_request), "max_inputs_per_request"
        ),
        max_body_bytes=_positive_int(top.get("max_body_bytes", defaults.max_body_bytes), "max_body_bytes"),
        upstream_api_key_env=_opt_str(top, "upstream_api_key_env"),
        request_timeout_s=_request_timeout(top),
        api_keys_env=_opt_str(top, "api_keys_env"),
    )


def _request_timeout(top: dict[str, Any]) -> float | None:
    if top.get("request_timeout_s") is None:
        return None
    value = _positive_float(top["request_timeout_s"], "request_timeout_s")
    timeout = _positive_float(top.get("timeout_s", GatewayConfig.timeout_s), "timeout_s")
    if value > timeout:
        raise GatewayConfigError(
            f"request_timeout_s: {value:g} s is over timeout_s ({timeout:g} s, one upstream call): "
            "the end-to-end deadline must be at most that"
        )
    return value


def _pool(name: str, raw: object) -> PoolConfig:
    where = f"pools.{name}"
    body = _mapping(raw, where, _POOL_KEYS)
    for key in ("max_tokens", "upstreams"):
        if key not in body:
            raise GatewayConfigError(f"{where}: missing '{key}'")
    ups = body["upstreams"]
    if not isinstance(ups, list) or not ups:
        raise GatewayConfigError(f"{where}.upstreams: expected a non-empty list of http:// URLs")
    urls = tuple(normalize_url(u, f"{where}.upstreams[{i}]") for i, u in enumerate(ups))
    dup = next((u for i, u in enumerate(urls) if u in urls[:i]), None)
    if dup is not None:
        raise GatewayConfigError(f"{where}.upstreams: {dup} is listed twice")
    classes = body.get("classes", list(TRAFFIC_CLASSES))
    if not isinstance(classes, list) or not classes:
        raise GatewayConfigError(f"{where}.classes: expected a non-empty list out of {list(TRAFFIC_CLASSES)}")
    for c in classes:
        _choice(c, f"{where}.classes", TRAFFIC_CLASSES)
    schema = body.get("schema")
    if schema is not None and (not isinstance(schema, str) or not schema):
        raise GatewayConfigError(f"{where}.schema: expected an embedding_schema string such as es1-...")
    return PoolConfig(
        name=name,
        max_tokens=_positive_int(body["max_tokens"], f"{where}.max_tokens"),
        upstreams=urls,
        classes=frozenset(classes),
        schema=schema,
        max_inflight_tokens=None
        if body.get("max_inflight_tokens") is None
        else _positive_int(body["max_inflight_tokens"], f"{where}.max_inflight_tokens"),
    )


def _route(i: int, raw: object, pools: Mapping[str, PoolConfig]) -> RouteConfig:
    where = f"routes[{i}]"
    body = _mapping(raw, where, _ROUTE_KEYS)
    if "class" not in body or "order" not in body:
        raise GatewayConfigError(f"{where}: needs 'class' and 'order'")
    cls = _choice(body["class"], f"{where}.class", TRAFFIC_CLASSES)
    order = body["order"]
    if not isinstance(order, list) or not order or not all(isinstance(n, str) for n in order):
        raise GatewayConfigError(f"{where}.order: expected a non-empty list of pool names")
    for name in order:
        if name not in pools:
            raise GatewayConfigError(f"{where}.order: unknown pool {name!r}; pools: {', '.join(pools)}")
        if order.count(name) > 1:
            raise GatewayConfigError(f"{where}.order: pool {name!r} is listed twice")
        # A pool states which classes it accepts: batch reaches an online pool only if listed.
        if cls not in pools[name].classes:
            raise GatewayConfigError(
                f"{where}.order: pool {name!r} does not accept class {cls!r} "
                f"(its classes: {sorted(pools[name].classes)})"
            )
    return RouteConfig(traffic_class=cls, order=tuple(order))


def _check_routes(routes: tuple[RouteConfig, ...], pools: tuple[PoolConfig, ...]) -> None:
    seen: set[str] = set()
    for r in routes:
        if r.traffic_class in seen:
            raise GatewayConfigError(f"routes: class {r.traffic_class!r} has two routes")
        seen.add(r.traffic_class)
    used = {name for r in routes for name in r.order}
    unused = [p.name for p in pools if p.name not in used]
    if unused:
        raise GatewayConfigError(
            f"pools {unused} appear in no route: add them to a route's order or remove them"
        )


def normalize_url(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise GatewayConfigError(f"{where}: expected a URL string, got {raw!r}")
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GatewayConfigError(f"{where}: expected http://HOST:PORT, got {raw!r}")
    if parts.query or parts.fragment:
        raise GatewayConfigError(f"{where}: a base URL takes no query or fragment, got {raw!r}")
    # Accept "http://h:p", "http://h:p/" and "http://h:p/v1": the gateway appends /v1/... itself.
    return raw.rstrip("/").removesuffix("/v1")


def _mapping(raw: object, where: str, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise GatewayConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    if allowed is not None:
        # A typo ("max_token") must not silently fall back to a default.
        unknown = sorted(str(k) for k in raw if k not in allowed)
        if unknown:
            raise GatewayConfigError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return raw


def _choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise GatewayConfigError(f"{where}: expected one of {list(choices)}, got {value!r}")
    return str(value)


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GatewayConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _positive_float(value: object, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise GatewayConfigError(f"{where}: expected a positive number of seconds, got {value!r}")
    return float(value)


def _opt_str(top: dict[str, Any], key: str) -> str | None:
    value = top.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise GatewayConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value
