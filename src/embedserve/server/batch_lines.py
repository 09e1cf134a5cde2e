"""Batch lines answered in-process by the server's own serving template (server/pipeline.py
`answer`): exactly what `embedserve serve` answers for the body, at the batch priority, waiting out
backpressure as Retry-After says (batch/execute.py). `embedserve run-batch --model` and the online
batch API (`serve --batch-dir`) run their lines here."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from embedserve.api.http import body_too_large
from embedserve.api.protocol import ApiError
from embedserve.batch.execute import RETRY_STATUS, at_batch_priority, retry_after_s
from embedserve.batch.format import BatchLine, Result, answered
from embedserve.server.pipeline import ServerRoute, answer, bind, check_request
from embedserve.server.routes import server_routes
from embedserve.server.serving import EmbeddingService, engine_errors


async def _never() -> None:
    """A batch line has no client to go away."""
    await asyncio.Event().wait()


class InProcess:
    """Lines answered by `server/pipeline.py`'s `answer` on a started server's service (`service()`:
    the one accepting work now, or the server's 503); a body over `max_body_bytes` gets the
    server's 413."""

    def __init__(self, service: Callable[[], EmbeddingService], retries: int, max_body_bytes: int) -> None:
        self.service = service
        self.retries = retries
        self.max_body_bytes = max_body_bytes
        self.bound: dict[str, ServerRoute[Any]] = {
            b.route.name: ServerRoute(
                dataclasses.replace(b.route, parse=at_batch_priority(b.route.parse)), b.job
            )
            for b in server_routes()
        }

    async def __call__(self, line: BatchLine) -> Result:
        bound = self.bound[line.route.name]
        for attempt in range(self.retries + 1):
            try:
                if len(line.body) > self.max_body_bytes:
                    raise body_too_large(self.max_body_bytes)
                body, _ = await answer(self.service(), bound, line.body, _never)
            except ApiError as e:
                if e.status in RETRY_STATUS and attempt < self.retries:
                    await asyncio.sleep(retry_after_s(e.headers))
                    continue
                return answered(line, e.status, e.body())
            return answered(line, 200, body)
        raise AssertionError("unreachable: the last attempt returns")

    async def validate(self, line: BatchLine) -> ApiError | None:
        """What the server would refuse in `line` before any engine work (its body, task, model,
        input limit, tokens: an over-long input under `truncate: error`), or None."""
        bound = self.bound[line.route.name]
        try:
            if len(line.body) > self.max_body_bytes:
                raise body_too_large(self.max_body_bytes)
            svc, job = bind(self.service(), bound, bound.route.parse(line.body))
            check_request(svc, bound.route, job)
            with engine_errors(svc.on_forward_failure, job.truncate_remedy):
                await asyncio.to_thread(job.tokenize)
        except ApiError as e:
            return e
        return None
