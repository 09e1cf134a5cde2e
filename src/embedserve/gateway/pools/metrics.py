"""Prometheus metrics of the gateway: per pool and traffic class, plus live upstream health."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from embedserve.gateway.pools.upstreams import UpstreamSet

TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self, upstreams: UpstreamSet | None) -> None:
        """`upstreams`: HTTP upstreams whose health is exported (None: pools export their own)."""
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def seconds(name: str, doc: str, labels: tuple[str, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=TIME_BUCKETS, registry=r)

        self.requests = counter(
            "embedserve_gateway_requests",
            "Client requests by traffic class and HTTP status",
            ("traffic_class", "status"),
        )
        self.latency = seconds(
            "embedserve_gateway_request_latency_seconds",
            "End-to-end latency of successful requests",
            ("traffic_class",),
        )
        # Gateway time not spent waiting for the slowest upstream call: what the hop costs.
        self.overhead = seconds(
            "embedserve_gateway_overhead_seconds",
            "Request latency minus the slowest upstream call",
            ("traffic_class",),
        )
        self.pool_requests = counter(
            "embedserve_gateway_pool_requests",
            "Requests sent to a pool by outcome (ok, rejected: 429/503, unreachable, failed)",
            ("pool", "traffic_class", "outcome"),
        )
        self.pool_inputs = counter(
            "embedserve_gateway_pool_inputs", "Inputs embedded by a pool", ("pool", "traffic_class")
        )
        self.pool_tokens = counter(
            "embedserve_gateway_pool_tokens", "Input tokens embedded by a pool", ("pool", "traffic_class")
        )
        self.pool_latency = seconds(
            "embedserve_gateway_pool_latency_seconds",
            "Latency of successful upstream calls",
            ("pool", "traffic_class"),
        )
        self.pool_queue = seconds(
            "embedserve_gateway_pool_queue_seconds",
            "Time a part waited for its pool's max_inflight_tokens allowance",
            ("pool", "traffic_class"),
        )
        self.fallbacks = counter(
            "embedserve_gateway_fallbacks",
            "Parts moved past a pool (no upstream ready, 429/503, connection error)",
            ("pool", "traffic_class", "reason"),
        )
        self.rejections = counter(
            "embedserve_gateway_rejections",
            "Requests the gateway refused (too_long, no_capacity, unavailable)",
            ("traffic_class", "reason"),
        )
        self.count_mismatches = counter(
            "embedserve_gateway_count_mismatches",
            "Inputs whose token count at the upstream differed from the gateway's (routing was inexact)",
            ("pool",),
        )
        self._health: _HealthCollector | None = None
        if upstreams is not None:
            self._health = _HealthCollector(upstreams)
            r.register(self._health)

    def watch(self, upstreams: UpstreamSet) -> None:
        """Export these upstreams' health from now on (a reloaded model keeps its metrics)."""
        if self._health is not None:
            self._health.upstreams = upstreams


class _HealthCollector(Collector):
    """Upstream health and load, read at scrape time."""

    def __init__(self, upstreams: UpstreamSet) -> None:
        """`upstreams`: HTTP upstreams whose health is exported (None: pools export their own)."""
        self.upstreams = upstreams

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "embedserve_gateway_upstream_up",
            "1 if the upstream is in its pool's rotation",
            labels=["pool", "upstream"],
        )
        load = GaugeMetricFamily(
            "embedserve_gateway_upstream_outstanding_tokens",
            "Tokens sent to the upstream and not yet answered",
            labels=["upstream"],
        )
        for pool in self.upstreams.pools.values():
            for u in pool.members:
                up.add_metric([pool.name, u.url], 0.0 if pool.reasons[u.url] else 1.0)
        for u in self.upstreams.upstreams.values():
            load.add_metric([u.url], u.outstanding_tokens)
        yield up
        yield load
