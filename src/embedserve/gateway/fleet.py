"""The gateway's models: one GatewayService per served model (its own counter, pools, routes,
schema guard and metrics), picked by each request's `model` (gateway/fleet_config.py). With one
model in the single-model form it is that service, unchanged: a request naming another model is
that service's 404, as before."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from embedserve.api.protocol import ApiError, clip
from embedserve.gateway.service import GatewayService

R = TypeVar("R")
# A tenant's permission (gateway/tenancy/tenants.py Tenant.may_use): names it may see in an error
MayUse = Callable[[Iterable[str | None]], bool]


class Fleet:
    def __init__(self, services: Sequence[GatewayService], aliases: dict[str, str] | None = None) -> None:
        if not services:
            raise ValueError("a gateway serves at least one model")
        self.services = tuple(services)
        self.aliases = dict(aliases or {})
        self.by_name = {s.config.served_model_name: s for s in services if s.config.served_model_name}
        self.single = len(self.services) == 1 and not self.by_name
        if not self.single and len(self.by_name) != len(self.services):
            raise ValueError("every model of a many-model gateway has its served name")
        self._merged = None if self.single else _merged(self.by_name)

    @property
    def registry(self) -> CollectorRegistry:
        """What /metrics exports: the one model's registry, or every model's, labelled."""
        return self.services[0].metrics.registry if self._merged is None else self._merged

    @property
    def default(self) -> GatewayService:
        """The first model: what TEI's `/info` and a request without `model` on a one-model
        gateway mean."""
        return self.services[0]

    def names(self, may_use: MayUse | None = None) -> str:
        """The served names and aliases, those a tenant `may_use` where given."""
        ok = may_use or (lambda names: True)
        served = ", ".join(repr(n) for n in self.by_name if ok([n, *self.aliases_of(n)]))
        aliases = ", ".join(
            f"{a!r} -> {t!r}" for a, t in self.aliases.items() if ok([a, t, *self.aliases_of(t)])
        )
        return (served or "no model this key may use") + (f" (aliases: {aliases})" if aliases else "")

    def resolve(self, model: str | None, may_use: MayUse | None = None) -> tuple[GatewayService, str | None]:
        """The service for a request's `model` and the served name it means (an alias resolved;
        None when the request named none); its 400 / 404 name the models `may_use` allows."""
        if self.single:
            return self.services[0], model
        if model is None:
            bases = [s for s in self.services if s.config.adapter is None]  # not LoRA adapters
            if len(bases) == 1:
                return bases[0], None
            raise ApiError(400, f"'model' is required: this gateway serves {self.names(may_use)}")
        name = self.aliases.get(model, model)
        service = self.by_name.get(name)
        if service is None:
            message = f"model {clip(model)} not found; this gateway serves {self.names(may_use)}"
            raise ApiError(404, message, "not_found_error")
        return service, name

    def for_request(self, req: R, may_use: MayUse | None = None) -> tuple[GatewayService, R]:
        """The service for a parsed request, and the request naming the served model (not its
        alias) so the service's own checks and answers use that name."""
        model = getattr(req, "model", None)
        service, name = self.resolve(model, may_use)
        if name is not None and name != model:
            req = req.model_copy(update={"model": name})  # type: ignore[attr-defined]
        return service, req

    def aliases_of(self, name: str) -> list[str]:
        return [a for a, t in self.aliases.items() if t == name]

    def names_of(self, asked: str | None, service: GatewayService) -> tuple[str | None, ...]:
        """A request's model by every name a tenant's `models` may give it: as asked, as served
        (the metrics' label, second) and the served model's aliases."""
        served = service.model_name or ""
        return (asked, served, *self.aliases_of(served))


def _merged(services: dict[str, GatewayService]) -> CollectorRegistry:
    """One registry over every model's metrics, each sample labelled with its `model` (the
    process's own metrics once)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_ByModel(services))
    return registry


class _ByModel(Collector):
    def __init__(self, services: dict[str, GatewayService]) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for i, (name, service) in enumerate(self.services.items()):
            for metric in service.metrics.registry.collect():
                if metric.name.startswith("process_"):
                    if i == 0:
                        yield metric
                    continue
                merged = families.get(metric.name)
                if merged is None:
                    merged = families[metric.name] = Metric(metric.name, metric.documentation, metric.type)
                merged.samples += [s._replace(labels={**s.labels, "model": name}) for s in metric.samples]
        yield from families.values()


def cards(fleet: Fleet, card: Any) -> list[dict[str, Any]]:
    """`/v1/models`: every model whose pools answer (`card(service)`), with its aliases."""
    found = []
    for service in fleet.services:
        try:
            c = card(service)
        except ApiError:
            continue  # not in rotation yet: listed once one of its upstreams is
        if not fleet.single:
            c["aliases"] = fleet.aliases_of(str(c["id"]))
        found.append(c)
    if not found:
        raise ApiError(503, "no upstream is in rotation yet", "service_unavailable", {"Retry-After": "1"})
    return found
