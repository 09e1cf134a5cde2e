"""The gateway's tenants (gateway/tenancy/tenant_config.py) at run time: who a request's key belongs to,
what it may use, and its quotas.

- the key: compared in constant time against every tenant's keys (never logged); none or an
  unknown one is a 401 (the gateway's own `--api-key` keys belong to no tenant: no limits);
- a model or traffic class the tenant may not use: 403 naming it;
- `requests_per_minute`, `max_concurrent_requests` before any work, `tokens_per_minute` once the
  request's tokens are counted (before any pool sees it): 429 with Retry-After from the quota's
  refill. Each tenant has its own buckets: one over its quota never slows another.

Metrics per tenant and model: requests by status, tokens, rejections by reason.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from embedserve.api.auth import unauthorized
from embedserve.api.protocol import ApiError, clip
from embedserve.batch.store import owner_of
from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.gateway.pools.fair import CURRENT_TENANT, QUEUE_OBSERVER
from embedserve.gateway.pools.metrics import TIME_BUCKETS
from embedserve.gateway.tenancy.quota import Bucket, Clock, quota_bucket
from embedserve.gateway.tenancy.tenant_config import TenantConfig

TENANT_OWNER = "tenant:"  # a tenant's batches' owner: this and its name (batch/store.py `_owner`)
T = TypeVar("T")


class Tenant:
    def __init__(self, config: TenantConfig, metrics: TenantMetrics, clock: Clock = time.monotonic) -> None:
        self.name = config.name
        self.metrics = metrics
        self.clock = clock
        self.tokens: Bucket | None = None
        self.requests: Bucket | None = None
        self.active = 0
        self.reconfigure(config)

    def reconfigure(self, config: TenantConfig) -> None:
        """New settings (a reload): requests running keep counting in `active`, and a quota
        whose rate did not change keeps its bucket's level."""
        self.config = config
        self.tokens = quota_bucket(self.tokens, config.tokens_per_minute, self.clock)
        self.requests = quota_bucket(self.requests, config.requests_per_minute, self.clock)

    def may_use(self, names: Iterable[str | None]) -> bool:
        """The tenant may use a model known by any of `names` (as asked, as served, its aliases)."""
        models = self.config.models
        return models is None or bool(models.intersection(n for n in names if n))

    def allow_model(self, names: tuple[str | None, ...]) -> None:
        """403 naming the model and the tenant's models unless it `may_use` it."""
        if not self.may_use(names):
            self._refuse("model")
            asked = clip(next((n for n in names if n), None))
            allowed = sorted(self.config.models or ())
            message = f"tenant {self.name!r} may not use model {asked}; it may use {allowed}"
            raise ApiError(403, message, "permission_error")

    def allow(self, names: tuple[str | None, ...], traffic_class: str) -> None:
        """403 unless the tenant may use the model (any of `names`: as asked, as served, its
        aliases) and class."""
        self.allow_model(names)
        if traffic_class not in self.config.classes:
            self._refuse("class")
            classes = sorted(self.config.classes)
            message = f"tenant {self.name!r} may not send {traffic_class!r} traffic; it may send {classes}"
            raise ApiError(403, message, "permission_error")

    def begin(self) -> None:
        """A request starts: its requests_per_minute and max_concurrent_requests, or 429."""
        limit = self.config.max_concurrent_requests
        if limit is not None and self.active >= limit:
            self._refuse("concurrency")
            raise self._over(f"{limit} concurrent requests", 1.0)
        if self.requests is not None:
            wait = self.requests.wait_s(1)
            if wait > 0:
                self._refuse("requests_per_minute")
                raise self._over(f"{self.config.requests_per_minute} requests per minute", wait)
            self.requests.take(1)
        self.active += 1

    def end(self) -> None:
        self.active -= 1

    def charge(self, tokens: int) -> None:
        """The request's counted tokens against tokens_per_minute, or 429."""
        if self.tokens is None:
            return
        wait = self.tokens.wait_s(tokens)
        if wait > 0:
            self._refuse("tokens_per_minute")
            raise self._over(f"{self.config.tokens_per_minute} tokens per minute ({tokens} asked)", wait)
        self.tokens.take(tokens)

    async def serve(
        self,
        names: tuple[str | None, ...],
        traffic_class: str,
        run: Callable[[Callable[[int], None]], Awaitable[T]],
    ) -> T:
        """`run(charge)`: the request's work, which calls `charge(tokens)` once it counted them;
        `names`: its model as asked and as served. Checked (`allow`), begun (429 over a quota),
        ended however it ends, counted by status."""
        model = names[1] or ""  # as served (Fleet.names_of)
        status, begun, charged = "500", False, 0

        def charge(tokens: int) -> None:
            nonlocal charged
            self.charge(tokens)
            charged = tokens

        scope = CURRENT_TENANT.set((self.name, self.config.weight))  # its parts' fair share
        queue = None
        try:
            self.allow(names, traffic_class)
            self.begin()
            begun = True
            queue = QUEUE_OBSERVER.set(self.metrics.queue.labels(self.name, model, traffic_class).observe)
            answer = await run(charge)
            status = "200"
            return answer
        except ApiError as e:
            status = str(e.status)
            raise
        except asyncio.CancelledError:
            status = "499"
            raise
        finally:
            CURRENT_TENANT.reset(scope)
            if queue is not None:
                QUEUE_OBSERVER.reset(queue)
            if begun:
                self.end()
            self.metrics.requests.labels(self.name, model, traffic_class, status).inc()
            if status == "200":
                self.metrics.tokens.labels(self.name, model, traffic_class).inc(charged)

    def _refuse(self, reason: str) -> None:
        self.metrics.rejections.labels(self.name, reason).inc()

    def _over(self, quota: str, wait_s: float) -> ApiError:
        retry = max(1, math.ceil(wait_s))
        return ApiError(
            429,
            f"tenant {self.name!r} is over its quota of {quota}; retry in {retry} s",
            "rate_limit_error",
            {"Retry-After": str(retry)},
        )


class TenantMetrics:
    """In a registry of their own (gateway/app.py's /metrics shows it after the models'), kept
    across reloads (gateway/live.py)."""

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "embedserve_gateway_tenant_requests",
            "Client requests by tenant, model, traffic class and HTTP status",
            ("tenant", "model", "traffic_class", "status"),
            registry=registry,
        )
        self.tokens = Counter(
            "embedserve_gateway_tenant_tokens",
            "Input tokens of a tenant's answered requests, by model and traffic class",
            ("tenant", "model", "traffic_class"),
            registry=registry,
        )
        self.rejections = Counter(
            "embedserve_gateway_tenant_rejections",
            "A tenant's requests refused before any pool (model, class, requests_per_minute, "
            "max_concurrent_requests, tokens_per_minute)",
            ("tenant", "reason"),
            registry=registry,
        )
        self.queue = Histogram(
            "embedserve_gateway_tenant_queue_seconds",
            "Seconds each part of a tenant's requests waited for a pool's allowance (fair share; "
            "online parts never wait there), by model and traffic class",
            ("tenant", "model", "traffic_class"),
            buckets=TIME_BUCKETS,
            registry=registry,
        )


class Tenants:
    def __init__(
        self,
        configs: tuple[TenantConfig, ...],
        metrics: TenantMetrics | None = None,
        clock: Clock = time.monotonic,
        previous: Tenants | None = None,
    ) -> None:
        """`previous`: the tenants a reload replaces: one keeping its name is the same Tenant,
        reconfigured (its running requests and unchanged quotas carry over)."""
        self.metrics = metrics if metrics is not None else TenantMetrics()
        self.by_name: dict[str, Tenant] = {}
        for c in configs:
            kept = previous.by_name.get(c.name) if previous is not None else None
            if kept is not None:
                kept.reconfigure(c)
            self.by_name[c.name] = kept if kept is not None else Tenant(c, self.metrics, clock)
        self._keys = [(key.encode(), self.by_name[c.name]) for c in configs for key in c.api_keys()]
        owners: dict[bytes, str] = {}
        for key, tenant in self._keys:
            if owners.setdefault(key, tenant.name) != tenant.name:
                raise GatewayConfigError(f"tenants {owners[key]!r} and {tenant.name!r} share a key")

    def keys(self) -> tuple[str, ...]:
        return tuple(k.decode() for k, _ in self._keys)

    def of_key(self, key: str) -> Tenant | None:
        """The tenant holding `key` (constant time over every key), or None."""
        given = key.encode()
        found = None
        for k, tenant in self._keys:
            if hmac.compare_digest(given, k):
                found = tenant
        return found

    def owner_of_key(self, key: str) -> str | None:
        """Who owns the batch API's files and batches made with `key`: its tenant (every key of
        a tenant sees the same ones; its jobs' lines then run as that tenant), else the key
        itself (batch/store.py `owner_of`: a fingerprint, never the key)."""
        tenant = self.of_key(key)
        return owner_of(key) if tenant is None else TENANT_OWNER + tenant.name

    def of_owner(self, owner: str | None) -> Tenant | None:
        """The tenant a batch belongs to (None: not a tenant's); 403 for a tenant a reload removed."""
        if owner is None or not owner.startswith(TENANT_OWNER):
            return None
        tenant = self.by_name.get(owner[len(TENANT_OWNER) :])
        if tenant is None:
            name = owner[len(TENANT_OWNER) :]
            raise ApiError(403, f"tenant {name!r} is no longer served by this gateway", "permission_error")
        return tenant

    def visible(
        self, headers: Mapping[str, str], own: tuple[str, ...], cards: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """`/v1/models` as the request's key sees it: a tenant the models it may use (by id or
        alias), the gateway's own keys every model."""
        tenant = self.of_request(headers, own)
        if tenant is None:
            return cards
        return [c for c in cards if tenant.may_use([c.get("id"), *c.get("aliases", ())])]

    def of_request(self, headers: Mapping[str, str], own: tuple[str, ...]) -> Tenant | None:
        """The tenant of a request's key (None: one of the gateway's `own` keys); any other key is
        a 401 here too (the app checked it against the keys of its time, and a reload may have
        taken it away since)."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        key = token.strip()
        tenant = self.of_key(key) if scheme.lower() == "bearer" else None
        given = key.encode()
        if tenant is None and not any([hmac.compare_digest(given, k.encode()) for k in own]):
            raise unauthorized()
        return tenant
