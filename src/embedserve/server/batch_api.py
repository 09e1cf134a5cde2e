"""The online batch API on a server (`serve --batch-dir`): jobs whose lines run in-process on the
serving template (server/batch_lines.py) at the batch priority, about `--batch-share` of the
step budget in flight (batch/share.py), once the server is ready."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from embedserve.batch.online import BatchJobs
from embedserve.batch.settings import BatchSettings
from embedserve.batch.share import TokenShare
from embedserve.batch.store import BatchStore
from embedserve.server.batch_lines import InProcess
from embedserve.server.runtime import ServerRuntime
from embedserve.server.serving import EmbeddingService

# A job's line waits out backpressure and engine restarts for as long as they last (its batch's
# completion window, or a cancel, ends the wait).
LINE_RETRIES = 1_000_000


def server_batch_jobs(
    settings: BatchSettings,
    runtime: ServerRuntime,
    service: Callable[[], EmbeddingService],
    max_body_bytes: int,
) -> BatchJobs:
    """`service()`: the accepting service, or the server's 503 (server/app.py)."""

    def budget() -> int:
        return service().engine.config.scheduler.max_num_batched_tokens

    async def ready() -> None:
        while not (runtime.accepting and runtime.service is not None):
            await asyncio.sleep(0.2)

    share = TokenShare(budget, settings.share)
    host = InProcess(service, LINE_RETRIES, max_body_bytes)
    return BatchJobs(BatchStore(settings.dir, settings.retention_s), host, share, ready, share.add)
