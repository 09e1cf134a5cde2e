"""The online batch API on a gateway (`gateway --batch-dir`): each line runs through the gateway's
own pipeline as `batch` traffic (its batch pools; the online pools never see it), as a client's
request would, and waits out backpressure as Retry-After says (batch/execute.py). Validation
counts each line's tokens and places it as the pipeline does, without sending anything. With many
models (gateway/fleet.py) each line's `model` picks its model's pipeline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from embedserve.api.http import body_too_large
from embedserve.api.protocol import ApiError
from embedserve.api.refusals import body_priority
from embedserve.batch.execute import BATCH, RETRY_STATUS, at_batch_priority, retry_after_s
from embedserve.batch.format import BatchLine, Result, answered
from embedserve.batch.online import BATCH_OWNER, BatchJobs
from embedserve.batch.settings import BatchSettings
from embedserve.batch.store import BatchStore
from embedserve.gateway.app import handler_for
from embedserve.gateway.fleet import Fleet
from embedserve.gateway.live import Live
from embedserve.gateway.routes.pipeline import Answer, GatewayRoute
from embedserve.gateway.service import GatewayService
from embedserve.gateway.tenancy.tenants import Tenant

LINE_RETRIES = 1_000_000  # as the server's: the batch's completion window or a cancel ends the wait
WINDOW = 8  # lines in flight: the batch pools' own admission and queues do the rest


class GatewayLines:
    def __init__(self, live: Live, retries: int = LINE_RETRIES) -> None:
        self.live = live  # read at every line: a reload's models serve the lines after it
        self.retries = retries

    @property
    def fleet(self) -> Fleet:
        return self.live.fleet

    def _names(self, line: BatchLine, service: GatewayService) -> tuple[str | None, ...]:
        """The line's model by every name a tenant's `models` may give it (Fleet.names_of)."""
        try:
            asked = json.loads(line.body).get("model")
        except (ValueError, AttributeError):
            asked = None
        return self.fleet.names_of(asked if isinstance(asked, str) else None, service)

    def _parse(self, line: BatchLine) -> tuple[GatewayService, Any, str]:
        limit = self.fleet.default.config.max_body_bytes
        if len(line.body) > limit:
            raise body_too_large(limit)
        service, req = self.fleet.for_request(at_batch_priority(line.route.parse)(line.body))
        return service, req, body_priority(req)[0] if "priority" in req.model_fields_set else BATCH

    def _tenant(self) -> Tenant | None:
        """The tenant whose batch this line is (its permissions, quotas and fair share apply)."""
        tenants = self.live.tenants
        return None if tenants is None else tenants.of_owner(BATCH_OWNER.get())

    async def __call__(self, line: BatchLine) -> Result:
        bound = handler_for(line.route)
        for attempt in range(self.retries + 1):
            try:
                body, headers = await self._once(line, bound)
            except ApiError as e:
                if e.status in RETRY_STATUS and attempt < self.retries:
                    await asyncio.sleep(retry_after_s(e.headers))
                    continue
                return answered(line, e.status, e.body())
            return answered(line, 200, body, headers.get("x-request-id"))
        raise AssertionError("unreachable: the last attempt returns")

    async def _once(self, line: BatchLine, bound: GatewayRoute[Any]) -> Answer:
        """The line through its model's pipeline, as its batch's tenant where it has one."""
        service, req, traffic_class = self._parse(line)
        tenant = self._tenant()
        if tenant is None:
            return await service.serve(bound, req, traffic_class)

        def run(charge: Callable[[int], None]) -> Awaitable[Answer]:
            return service.serve(bound, req, traffic_class, charge=charge)

        return await tenant.serve(self._names(line, service), traffic_class, run)

    async def validate(self, line: BatchLine) -> ApiError | None:
        """The gateway's refusals of the line (body, model, class, input count, tokens), or None;
        no pool ready (503) is waited out, not a refusal."""
        while True:
            try:
                svc, req, traffic_class = self._parse(line)
                tenant = self._tenant()
                if tenant is not None:
                    tenant.allow(self._names(line, svc), traffic_class)
                job = handler_for(line.route).job(svc, req)
                await svc.place(job, svc.route_for(traffic_class, job.model), traffic_class)
            except ApiError as e:
                if e.status == 503:
                    await asyncio.sleep(retry_after_s(e.headers))
                    continue
                return e
            return None


def gateway_batch_jobs(settings: BatchSettings, live: Live) -> BatchJobs:
    lines = GatewayLines(live)

    async def ready() -> None:
        """Every model's batch route has a pool that can take work."""
        for service in lines.fleet.services:
            route = service.config.route(BATCH)
            while route is not None and not service.upstreams.available().intersection(route.order):
                await asyncio.sleep(0.2)

    store = BatchStore(settings.dir, settings.retention_s)
    return BatchJobs(store, lines, lambda: WINDOW, ready)
