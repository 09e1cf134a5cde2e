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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import yaml

from embedserve.gateway.pools.fields import GatewayConfigError as GatewayConfigError  # every parser's
from embedserve.gateway.pools.fields import Key, key, key_names, read_fields, section

T = TypeVar("T")
TRAFFIC_CLASSES = ("online", "batch")
BALANCE_POLICIES = ("least_tokens", "round_robin")

_ROUTE_KEYS = {"class", "order"}
_CLASS = Key("choice", choices=TRAFFIC_CLASSES)  # a traffic class, in a pool's classes or a route


@dataclass(frozen=True)
class PoolConfig:
    name: str
    max_tokens: int
    upstreams: tuple[str, ...]  # base URLs without a trailing "/" or "/v1"
    classes: frozenset[str]
    schema: str | None = None  # pinned embedding_schema
    # Tokens the gateway keeps in flight to the pool; more wait, in fair order (gateway/pools/fair.py).
    max_inflight_tokens: int | None = key(None, "positive_int", optional=True)


@dataclass(frozen=True)
class RouteConfig:
    traffic_class: str
    order: tuple[str, ...]  # pool names: fallback order


@dataclass(frozen=True)
class GatewayConfig:
    pools: tuple[PoolConfig, ...]
    routes: tuple[RouteConfig, ...]
    # The top-level keys, each read by its declaration (gateway/pools/fields.py):
    model: str | None = key(None, "text", optional=True)
    served_model_name: str | None = key(None, "text", optional=True)
    balance: str = key("least_tokens", "choice", choices=BALANCE_POLICIES)
    health_interval_s: float = key(2.0, "seconds")
    timeout_s: float = key(600.0, "seconds")
    max_inputs_per_request: int = key(2048, "positive_int")
    max_body_bytes: int = key(32 << 20, "positive_int")
    upstream_api_key_env: str | None = key(None, "text", optional=True)
    request_timeout_s: float | None = key(None, "seconds", optional=True)  # None: timeout_s
    api_keys_env: str | None = key(None, "text", optional=True)
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
    top = section(raw, "the config", {"pools", "routes", *key_names(GatewayConfig)})
    if "pools" not in top or "routes" not in top:
        raise GatewayConfigError("the config needs both 'pools' and 'routes'")
    pools = tuple(_pool(str(name), body) for name, body in section(top["pools"], "pools", None).items())
    if not pools:
        raise GatewayConfigError("pools: define at least one pool")
    if not isinstance(top["routes"], list) or not top["routes"]:
        raise GatewayConfigError("routes: expected a non-empty list of {class, order} entries")
    known = {p.name: p for p in pools}
    routes = tuple(_route(i, r, known) for i, r in enumerate(top["routes"]))
    _check_routes(routes, pools)
    config = GatewayConfig(pools, routes, **read_fields(GatewayConfig, top, ""))
    value, timeout = config.request_timeout_s, config.timeout_s
    if value is not None and value > timeout:
        raise GatewayConfigError(
            f"request_timeout_s: {value:g} s is over timeout_s ({timeout:g} s, one upstream call): "
            "the end-to-end deadline must be at most that"
        )
    return config


def _pool(name: str, raw: object) -> PoolConfig:
    where = f"pools.{name}"
    body = section(raw, where, {"max_tokens", "upstreams", "classes", "schema", *key_names(PoolConfig)})
    for required in ("max_tokens", "upstreams"):
        if required not in body:
            raise GatewayConfigError(f"{where}: missing '{required}'")
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
        _CLASS.read(c, f"{where}.classes")
    schema = body.get("schema")
    if schema is not None and (not isinstance(schema, str) or not schema):
        raise GatewayConfigError(f"{where}.schema: expected an embedding_schema string such as es1-...")
    max_tokens = Key("positive_int").read(body["max_tokens"], f"{where}.max_tokens")
    declared = read_fields(PoolConfig, body, where)
    return PoolConfig(name, max_tokens, urls, frozenset(classes), schema, **declared)


def _route(i: int, raw: object, pools: Mapping[str, PoolConfig]) -> RouteConfig:
    where = f"routes[{i}]"
    body = section(raw, where, _ROUTE_KEYS)
    if "class" not in body or "order" not in body:
        raise GatewayConfigError(f"{where}: needs 'class' and 'order'")
    cls = _CLASS.read(body["class"], f"{where}.class")
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
