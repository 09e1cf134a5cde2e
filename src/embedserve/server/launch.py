"""Run the app on uvicorn with a graceful, exit-0 SIGTERM and Ctrl-C (SIGINT)."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType

import uvicorn

from embedserve.server.app import create_app
from embedserve.server.runtime import ServerSettings

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signal first stops admission (readiness turns 503).

    uvicorn then stops accepting connections, waits for in-flight requests to finish and
    runs the app's shutdown (which closes the engine).
    """

    def __init__(self, config: uvicorn.Config, begin_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self._begin_drain = begin_drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._begin_drain()
        super().handle_exit(sig, frame)


def serve(settings: ServerSettings, host: str, port: int, log_level: str = "info") -> int:
    """Serve until SIGTERM / SIGINT (exit 0) or a failed model load / warm-up (exit 1)."""
    fatal: list[str] = []

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        server.should_exit = True

    app = create_app(settings, on_fatal)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_keep_alive=max(1, round(settings.timeout_keep_alive_s)),
        limit_concurrency=settings.limit_concurrency,
    )
    server = DrainingServer(config, app.state.runtime.begin_drain)
    # uvicorn re-raises a caught SIGTERM or SIGINT after its graceful shutdown so that the
    # previous handler runs; the default handlers would then kill the process (exit 143) or
    # raise KeyboardInterrupt through asyncio (a traceback, exit 130: Ctrl-C in a terminal).
    # The drain has already happened by then, so this handler only records it and the process
    # exits 0. A second Ctrl-C during the drain is still uvicorn's force quit.
    signal.signal(signal.SIGTERM, _drained)
    signal.signal(signal.SIGINT, _drained)
    server.run()
    if fatal:
        log.error("embedserve serve: %s", fatal[0])
        return 1
    return 0


def _drained(signum: int, frame: FrameType | None) -> None:
    log.info("shutdown complete")
