"""The replicas' server metrics on the ingress's /metrics, labelled by pool and replica.

Each pool replica pushes its Prometheus text (server/metrics.py: requests, latency by length
bucket, queue and engine gauges) to the hub every few seconds; the ingress polls the hub and
serves those families beside its own gateway metrics. A replica that stops pushing (dead,
replaced, scaled down) disappears after `STALE_S`.

    replica (pool=short, r1) ──push──> MetricsHub ──render──> ingress /metrics
    replica (pool=long,  r2) ──push──┘
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

STALE_S = 30.0
_PREFIX = "embedserve_"  # the replicas' process_* families would clash with the ingress's own


def relabel(snapshots: Mapping[tuple[str, str], str]) -> list[Metric]:
    """Families of every (pool, replica) text snapshot, merged by name, samples labelled."""
    merged: dict[str, Metric] = {}
    for (pool, replica), text in sorted(snapshots.items()):
        for family in text_string_to_metric_families(text):
            if not family.name.startswith(_PREFIX):
                continue
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            out.samples.extend(_labelled(family.samples, pool, replica))
    return list(merged.values())


def _labelled(samples: Iterable[Sample], pool: str, replica: str) -> Iterator[Sample]:
    for s in samples:
        yield s._replace(labels={**s.labels, "pool": pool, "replica": replica})


class MetricsHub:
    """Serve deployment (one replica): the latest text snapshot of each live pool replica."""

    def __init__(self) -> None:
        self._snapshots: dict[tuple[str, str], tuple[float, str]] = {}

    def report(self, pool: str, replica: str, text: str) -> None:
        self._snapshots[(pool, replica)] = (time.monotonic(), text)

    def snapshots(self) -> dict[tuple[str, str], str]:
        now = time.monotonic()
        for key in [k for k, (t, _) in self._snapshots.items() if now - t > STALE_S]:
            del self._snapshots[key]
        return {key: text for key, (_, text) in self._snapshots.items()}


class ReplicaCollector(Collector):
    """Serves the last snapshots the ingress fetched from the hub (refreshed by its poller)."""

    def __init__(self) -> None:
        self.snapshots: dict[tuple[str, str], str] = {}

    def collect(self) -> Iterator[Metric]:
        yield from relabel(self.snapshots)
