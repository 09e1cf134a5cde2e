"""Prometheus metrics: one registry per app (so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from embedserve.engine.engine import Engine
from embedserve.server.admission import Admission

_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)
_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, open fds
        self.requests = Counter(
            "embedserve_requests",
            "Embedding requests by HTTP status (499: client went away)",
            ["status"],
            registry=r,
        )
        self.input_tokens = Histogram(
            "embedserve_input_tokens", "Tokens per embedded input", buckets=_TOKEN_BUCKETS, registry=r
        )

        def seconds(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, labels, buckets=_TIME_BUCKETS, registry=r)

        self.tokenization_time = seconds("embedserve_tokenization_seconds", "Tokenization time per request")
        self.queue_time = seconds(
            "embedserve_queue_seconds", "Time an input waited before its first engine step"
        )
        self.inference_time = seconds(
            "embedserve_inference_seconds", "Time from an input's first engine step to its vector"
        )
        # By length bucket (embedserve.lengths: 0-1K ... 16K+) because a 16K document and a query are
        # different jobs: their latencies are never averaged together.
        self.latency = seconds(
            "embedserve_request_latency_seconds",
            "End-to-end latency of successful requests, by the longest input's token count",
            ("length_bucket",),
        )
        self.tokens = Counter("embedserve_tokens", "Input tokens embedded", registry=r)
        self.warmup_seconds = Gauge("embedserve_warmup_seconds", "Duration of the warm-up", registry=r)
        self._live = _LiveCollector()
        r.register(self._live)

    def bind(self, engine: Engine, admission: Admission) -> None:
        """Start exporting the engine's and the admission queue's live state."""
        self._live.engine = engine
        self._live.admission = admission


class _LiveCollector(Collector):
    """Values read at scrape time rather than pushed on every change."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.admission: Admission | None = None

    def collect(self) -> Iterator[Metric]:
        if self.admission is not None:
            a = self.admission
            yield _gauge("embedserve_admitted_inputs", "Inputs admitted and not yet answered", a.inputs)
            yield _gauge("embedserve_admitted_tokens", "Tokens admitted and not yet answered", a.tokens)
            yield _gauge(
                "embedserve_tokens_per_second",
                "Input tokens embedded per second (10 s window)",
                a.meter.rate(),
            )
        if self.engine is not None:
            s = self.engine.stats()
            yield _gauge("embedserve_requests_running", "Inputs the engine is computing", s["num_running"])
            yield _gauge("embedserve_requests_waiting", "Inputs queued in the engine", s["num_waiting"])
            yield _gauge("embedserve_kv_blocks_used", "KV cache blocks in use", s["kv_blocks_used"])
            yield _gauge("embedserve_kv_blocks_total", "KV cache blocks available", s["kv_blocks_total"])
            yield _counter("embedserve_preemptions", "Requests preempted to free KV blocks", s["preemptions"])
            yield _counter("embedserve_engine_steps", "Engine steps run", s["steps"])
            yield _counter(
                "embedserve_engine_tokens_computed",
                "Tokens run through the model (recomputation after preemption included)",
                s["tokens_computed"],
            )
            yield _counter(
                "embedserve_prefix_cache_hit_tokens",
                "Prompt tokens whose K/V came from the prefix cache (not computed)",
                s["prefix_hit_tokens"],
            )
            yield _counter(
                "embedserve_prefix_cache_query_tokens",
                "Prompt tokens of the requests that looked for a cached prefix (hit rate: hit / query)",
                s["prefix_query_tokens"],
            )
            yield _gauge(
                "embedserve_prefix_cache_blocks",
                "KV blocks whose content the prefix cache keeps (held by requests or not)",
                s["prefix_cached_blocks"],
            )
            yield _gauge(
                "embedserve_prefix_cache_pinned_blocks",
                "KV blocks holding the model's prompts for good (not counted in kv_blocks_used)",
                s["prefix_pinned_blocks"],
            )
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            yield _gauge(
                "embedserve_cuda_memory_allocated_bytes",
                "CUDA memory held by tensors",
                torch.cuda.memory_allocated(),
            )
            yield _gauge(
                "embedserve_cuda_memory_peak_bytes",
                "Peak CUDA memory held by tensors",
                torch.cuda.max_memory_allocated(),
            )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
