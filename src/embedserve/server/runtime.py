"""Server lifecycle: load in the background, warm up, report readiness, drain, close.

The HTTP socket opens before the model is loaded, so liveness answers at once while
readiness stays 503 until a warmed-up engine has produced correct vectors:

    LOADING -> WARMING_UP -> READY -> DRAINING        (FAILED from LOADING / WARMING_UP)
                               READY <-> RESTARTING    (the engine loop died: a new engine
                                                        is built and warmed up; FAILED after
                                                        `max_engine_restarts`)
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from embedserve.api.keepalive import KEEP_ALIVE_S
from embedserve.api.quantize import DEFAULT_INT8_SCALE, Calibration
from embedserve.batch.settings import BatchSettings
from embedserve.engine.engine import Engine
from embedserve.engine.options import EngineOptions
from embedserve.errors import ModelLoadError
from embedserve.schema import ModelMetadata, fingerprint_model_dir
from embedserve.server.admission import Admission, ThroughputMeter
from embedserve.server.metrics import ServerMetrics
from embedserve.server.result_cache import ResultCache
from embedserve.server.serving import EmbeddingService
from embedserve.server.warmup import probe, warm_up
from embedserve.tracing import SERVER_SERVICE, TraceSettings

if TYPE_CHECKING:
    from embedserve.tracing.otel import Tracing

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 30.0
_WATCH_INTERVAL_S = 0.5


@dataclass(frozen=True)
class ServerSettings:
    model: str
    engine: EngineOptions = field(default_factory=EngineOptions)
    served_model_name: str | None = None
    model_version: str | None = None
    api_keys: tuple[str, ...] = ()
    max_queued_tokens: int | None = None  # None: derived from the engine's limits at load
    max_queued_requests: int = 4096
    max_inputs_per_request: int = 2048
    max_output_vectors: int = 32768  # a multi-vector answer's vectors, all inputs together (more: 413)
    max_body_bytes: int = 32 << 20
    warmup_lengths: tuple[int, ...] | None = None  # None: DEFAULT_WARMUP_LENGTHS within max_model_len
    max_engine_restarts: int = 3  # engine loop deaths rebuilt in-process before the server fails
    body_timeout_s: float = 30.0  # whole body within this, else 408
    request_timeout_s: float = 300.0  # queue + compute within this, else 503 + Retry-After
    timeout_keep_alive_s: float = KEEP_ALIVE_S  # idle keep-alive connections closed after this
    limit_concurrency: int = 1024  # open connections + tasks beyond this get 503 from uvicorn
    # int8 / uint8 outputs: ranges from this .npy file, else [-int8_scale, int8_scale] (api/quantize.py)
    int8_calibration: str | None = None
    int8_scale: float = DEFAULT_INT8_SCALE
    tracing: TraceSettings | None = None  # OpenTelemetry traces (None: off; tracing/__init__.py)
    result_cache_entries: int = 0  # repeated inputs answered from memory (server/result_cache.py)
    batch: BatchSettings | None = None  # the online batch API (None: off; server/batch_api.py)

    def calibration(self) -> Calibration:
        if self.int8_calibration is not None:
            return Calibration.load(self.int8_calibration)
        return Calibration.fixed(self.int8_scale)

    def __post_init__(self) -> None:
        for name in ("max_queued_requests", "max_inputs_per_request", "max_body_bytes", "max_output_vectors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("body_timeout_s", "request_timeout_s", "timeout_keep_alive_s", "limit_concurrency"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.result_cache_entries < 0:
            raise ValueError("result_cache_entries must be >= 0 (0: no cache)")
        if self.max_queued_tokens is not None and self.max_queued_tokens < 1:
            raise ValueError("max_queued_tokens must be >= 1")
        if self.max_inputs_per_request > self.max_queued_requests:
            raise ValueError(
                f"max_inputs_per_request ({self.max_inputs_per_request}) exceeds max_queued_requests "
                f"({self.max_queued_requests}): a full request could never be admitted"
            )

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name


def keep_adapters(old: Engine, new: Engine) -> None:
    """The LoRA adapters `old` served when its loop died (as loaded, replaced and unloaded at run
    time), served by its replacement: the same weights, no file read again."""
    if old.adapters is not None and new.adapters is not None:
        new.adapters.adopt(old.adapters.all())


def default_max_queued_tokens(max_model_len: int, max_num_batched_tokens: int) -> int:
    # Room for a few maximal documents or many full steps, whichever is larger.
    return max(4 * max_model_len, 32 * max_num_batched_tokens)


class Phase(str, enum.Enum):
    LOADING = "loading"
    WARMING_UP = "warming_up"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"
    RESTARTING = "restarting"


class ServerRuntime:
    def __init__(
        self, settings: ServerSettings, metrics: ServerMetrics, on_fatal: Callable[[str], None] | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        entries = settings.result_cache_entries
        self.result_cache = ResultCache(entries, metrics.registry) if entries else None
        self.phase = Phase.LOADING
        self.error: str | None = None
        self.engine: Engine | None = None
        self.service: EmbeddingService | None = None
        self._on_fatal = on_fatal
        self._forward_failed = False
        self.restarts = 0
        self._watcher: asyncio.Task[None] | None = None
        self.tracing: Tracing | None = None
        if settings.tracing is not None:  # OpenTelemetry is imported only then
            from embedserve.tracing.otel import Tracing

            self.tracing = Tracing.start(settings.tracing, SERVER_SERVICE)

    async def start(self) -> None:
        s = self.settings
        try:
            calibration = s.calibration()
            engine = self.engine = await asyncio.to_thread(Engine.from_pretrained, s.model, s.engine)
            # The files were just read, so hashing them runs from the page cache.
            fingerprint = await asyncio.to_thread(fingerprint_model_dir, engine.config.model_path)
            metadata = ModelMetadata.from_engine_config(
                engine.config, s.model_name, s.model_version, fingerprint
            )
            clash = (
                [a.name for a in engine.adapters.all() if a.name == metadata.model] if engine.adapters else []
            )
            if clash:
                raise ModelLoadError(
                    f"LoRA adapter {clash[0]!r} has the served model's name: give it another"
                )
            merged = engine.adapters.merged if engine.adapters is not None else None
            if merged is not None:  # --merge-lora: the weights are the adapter's, served as it
                metadata = metadata.with_adapter(s.served_model_name or merged.name, merged.fingerprint)
            sched = engine.config.scheduler
            admission = Admission(
                s.max_queued_requests,
                s.max_queued_tokens
                or default_max_queued_tokens(sched.max_model_len, sched.max_num_batched_tokens),
                ThroughputMeter(),
            )
            self.metrics.bind(engine, admission)
            self.phase = Phase.WARMING_UP
            log.info("model loaded (%s, %s); warming up", metadata.model_version, metadata.backend_profile)
            seconds = await warm_up(engine, s.warmup_lengths)
        except Exception as e:
            if isinstance(e, ModelLoadError):  # the user's configuration: one line says it all
                log.error("server failed to start: %s", e)
            else:
                log.exception("server failed to start")
            self.phase, self.error = Phase.FAILED, f"{type(e).__name__}: {e}"
            if self._on_fatal is not None:
                self._on_fatal(self.error)
            return
        self.metrics.warmup_seconds.set(seconds)
        log.info("warm-up done in %.2f s; ready", seconds)
        self.service = EmbeddingService(
            engine,
            metadata,
            admission,
            self.metrics,
            s.max_inputs_per_request,
            self._forward_failure,
            s.request_timeout_s,
            calibration,
            self.tracing,
            self.result_cache,
            s.max_output_vectors,
        )
        if self.phase is Phase.WARMING_UP:  # a shutdown may have begun meanwhile
            self.phase = Phase.READY
            self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        """Rebuild the engine when its loop dies (a bug, a fault outside a forward pass): the
        requests it held got EngineDeadError (503); new ones get 503 + Retry-After meanwhile."""
        while self.phase in (Phase.READY, Phase.RESTARTING):
            await asyncio.sleep(_WATCH_INTERVAL_S)
            if self.phase is not Phase.READY or self.engine is None or self.engine.alive:
                continue
            if self.restarts >= self.settings.max_engine_restarts:
                self.phase, self.error = Phase.FAILED, f"the engine loop died {self.restarts + 1} times"
                log.error("%s; giving up", self.error)
                if self._on_fatal is not None:
                    self._on_fatal(self.error)
                return
            self.restarts += 1
            self.phase = Phase.RESTARTING
            log.error("the engine loop died; restarting the engine (restart %d)", self.restarts)
            try:
                await self._rebuild()
            except Exception as e:
                log.exception("engine restart failed")
                self.phase, self.error = Phase.FAILED, f"engine restart failed: {type(e).__name__}: {e}"
                if self._on_fatal is not None:
                    self._on_fatal(self.error)
                return
            if self.phase is Phase.RESTARTING:
                self.phase = Phase.READY

    async def _rebuild(self) -> None:
        assert self.engine is not None and self.service is not None
        s = self.settings
        await asyncio.to_thread(self.engine.close)
        engine = await asyncio.to_thread(Engine.from_pretrained, s.model, s.engine)
        await warm_up(engine, s.warmup_lengths)
        keep_adapters(self.engine, engine)
        self.engine = self.service.engine = engine
        self.service.views = {}
        self.metrics.bind(engine, self.service.admission)
        self._forward_failed = False
        log.info("engine restarted; ready")

    def _forward_failure(self) -> None:
        self._forward_failed = True

    async def readiness(self) -> tuple[bool, str]:
        """(ready, reason). After a failed forward pass, a probe must succeed to be ready again."""
        if self.phase is not Phase.READY:
            return False, self.error or self.phase.value
        assert self.engine is not None
        if not self.engine.alive:
            return False, "the engine loop has stopped"
        if self._forward_failed:
            try:
                await asyncio.wait_for(probe(self.engine), _PROBE_TIMEOUT_S)
            except Exception as e:
                return False, f"a forward pass failed and the probe failed too: {type(e).__name__}: {e}"
            self._forward_failed = False
        return True, "ready"

    def begin_drain(self) -> None:
        """Stop admitting new work; requests already admitted run to completion."""
        if self.phase is not Phase.FAILED:
            self.phase = Phase.DRAINING

    @property
    def accepting(self) -> bool:
        return self.phase is Phase.READY

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the spans not yet exported
