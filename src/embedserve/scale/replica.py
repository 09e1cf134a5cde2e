"""One replica of a pool deployment: the `embedserve serve` runtime without its HTTP layer.

The constructor loads the pool's model and runs the server's warm-up (server/runtime.py); Ray
Serve sends a replica traffic only once its constructor has returned, so a replica takes
requests only after its warm-up passed. `check_health` is the server's readiness (engine loop
alive, a probe after a failed forward pass): when it raises, Serve replaces the replica.
Requests (`request`: a route, its JSON body, the caller's time left) go through the server's
own routes (server/routes.py, every route api/routes.py declares) on its serving template
(server/pipeline.py: parsing, validation, admission with 429, the deadline's 503
`deadline_exceeded`, metrics by length bucket), so a replica answers exactly what
`embedserve serve` would, as a value (`answer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from prometheus_client import generate_latest

from embedserve.api.protocol import ApiError
from embedserve.api.routes import EMBEDDINGS_PATH
from embedserve.scale.config import ServePool, resolve_model
from embedserve.scale.policy import QUEUED_TOKENS
from embedserve.server.app import model_card
from embedserve.server.metrics import ServerMetrics
from embedserve.server.pipeline import ServerRoute
from embedserve.server.pipeline import answer as answer_route
from embedserve.server.routes import server_routes
from embedserve.server.runtime import ServerRuntime, ServerSettings

log = logging.getLogger(__name__)

_METRICS_PUSH_S = 2.0


class PoolReplica:
    async def __init__(self, pool: ServePool, served_model_name: str | None, hub: Any) -> None:  # type: ignore[misc]  # Serve awaits it
        from ray import serve

        self.pool = pool
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.metrics = ServerMetrics()
        settings = ServerSettings(
            model=resolve_model(pool.model),
            engine=pool.engine,
            served_model_name=served_model_name,
            max_queued_tokens=pool.max_queued_tokens,
            warmup_lengths=pool.warmup_lengths,
        )
        self.runtime = ServerRuntime(settings, self.metrics)
        await self.runtime.start()
        if self.runtime.service is None:  # load or warm-up failed: Serve retries the replica
            raise RuntimeError(f"pool {pool.name!r} replica failed to start: {self.runtime.error}")
        self._hub = hub
        self._pusher = asyncio.create_task(self._push_metrics())
        log.info("pool %r replica %s ready", pool.name, self.replica)

    async def request(self, path: str, payload: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        """The ingress's call (a handle method): see `answer`."""
        return await answer(self.runtime, self.metrics, path, payload, timeout_s)

    async def card(self) -> dict[str, Any]:
        """The server's /v1/models card (the ingress's schema guard reads it)."""
        assert self.runtime.service is not None
        return {**model_card(self.runtime.service), "replica": self.replica}

    async def check_health(self) -> None:
        ready, reason = await self.runtime.readiness()
        if not ready:
            raise RuntimeError(f"pool {self.pool.name!r} replica {self.replica}: {reason}")

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Tokens admitted and not yet answered: what the pool's autoscaling policy reads."""
        service = self.runtime.service
        return {QUEUED_TOKENS: float(service.admission.tokens if service is not None else 0)}

    async def _push_metrics(self) -> None:
        """The server's per-length-bucket metrics go to the hub, labelled by pool and replica."""
        while True:
            with contextlib.suppress(Exception):  # a hub restart must not stop the replica
                text = generate_latest(self.metrics.registry).decode()
                await self._hub.report.remote(self.pool.label, self.replica, text)
            await asyncio.sleep(_METRICS_PUSH_S)

    async def __del__(self) -> None:
        self._pusher.cancel()
        await self.runtime.close()


# The server's routes by every path they answer (the ingress sends a route's primary path).
_ROUTES: dict[str, ServerRoute[Any]] = {path: b for b in server_routes() for path in b.route.paths}


async def answer(
    runtime: ServerRuntime,
    metrics: ServerMetrics,
    path: str,
    payload: dict[str, Any],
    timeout_s: float | None,
) -> dict[str, Any]:
    """One request on `path` (a declared route's path: api/routes.py) by the server's handler,
    its body parsed as the server parses it; `timeout_s`: the caller's time left, as the
    server's X-Request-Timeout. Errors come back as values, as the server would answer them:
    {status, body, headers, embedding_schema: this replica's own, for the ingress's guard (a
    body's schema is the request's: other dimensions or types name another one)}."""
    service = runtime.service
    reply: dict[str, Any] = {"embedding_schema": None if service is None else service.metadata.schema()}
    try:
        if service is None or not runtime.accepting:
            raise ApiError(503, "replica is not accepting requests", "service_unavailable")
        bound = _ROUTES.get(path)
        if bound is None:
            raise ApiError(404, f"a replica answers {sorted(_ROUTES)}, not {path[:100]}", "not_found_error")
        body, headers = await answer_route(service, bound, json.dumps(payload).encode(), _never, timeout_s)
    except ApiError as e:
        reply |= {"status": e.status, "body": e.body(), "headers": e.headers}
    else:
        reply |= {"status": 200, "body": body, "headers": headers}
    if path == EMBEDDINGS_PATH:  # what the server's /metrics counts (server/app.py)
        metrics.requests.labels(str(reply["status"])).inc()
    return reply


async def _never() -> None:
    """The ingress cancels this call when its client goes away; nothing to wait for here."""
    await asyncio.Event().wait()
