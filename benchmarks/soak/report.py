"""Soak report math: pure functions over the samples a run recorded (tested on fabricated ones).

Outcomes of a request: `ok` (200 with a vector), `refused` (429 carrying Retry-After), `failed`
(any other answer: a status with an error body, or a transport error / client timeout — the
latter two are what "lost silently" would look like, so they are counted apart as `no_status`).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from embedserve.lengths import BUCKET_NAMES, bucket_of

COSINE_BAR = 0.99999  # fp32 server vs fp32 in-process reference, same model
RSS_BOUND_FRACTION, RSS_BOUND_MIB = 0.10, 64.0  # allowed RSS growth after warm-up: the larger
_DIGITS = re.compile("[0-9]+")
FD_BOUND = 8  # allowed growth of open file descriptors after warm-up


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it."""

    start: float  # seconds since the run began
    end: float
    tokens: int
    klass: str  # online | batch
    phase: str  # load | after
    status: int  # HTTP status; 0 = no answer (transport error, client timeout)
    retry_after: bool = False
    error: str = ""  # error body message or transport error, clipped

    @property
    def outcome(self) -> str:
        if self.status == 200:
            return "ok"
        if self.status == 429 and self.retry_after:
            return "refused"
        return "failed"


@dataclass(frozen=True)
class ProcSample:
    """One reading of a server process (psutil) and its queue gauges (/metrics)."""

    t: float
    name: str
    rss_mib: float
    fds: int


@dataclass
class Summary:
    counts: dict[str, dict[str, int]]  # phase -> outcome -> n
    by_bucket: dict[str, dict[str, int]]  # load phase: bucket -> outcome -> n
    statuses: dict[str, int]  # "status: first error message" -> n, for everything not 200
    no_status: int  # failures without an HTTP status: the silent kind
    latency: dict[str, dict[str, dict[str, float]]]  # phase -> bucket -> {n, p50_ms, p99_ms}
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)  # RSS MiB / fds per process every 10 s
    cosine: dict[str, Any] = field(default_factory=dict)
    queue_after: dict[str, dict[str, float]] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_table(samples: list[Sample]) -> dict[str, dict[str, dict[str, float]]]:
    """Successful requests' latency per phase and length bucket (buckets never mixed)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for phase in sorted({s.phase for s in samples}):
        rows: dict[str, dict[str, float]] = {}
        for bucket in BUCKET_NAMES:
            ms = [
                1000 * (s.end - s.start)
                for s in samples
                if s.phase == phase and s.outcome == "ok" and bucket_of(s.tokens) == bucket
            ]
            if ms:
                rows[bucket] = {"n": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
        out[phase] = rows
    return out


def growth(
    readings: list[ProcSample], warm_until: float, load_end: float | None = None
) -> dict[str, dict[str, float]]:
    """Per process: RSS and fds at the end of warm-up (median of the last 5 readings before
    `warm_until`), peak after it, and at the end (median of the last 5 readings). `bounded` is 1
    for a process that lived from before the end of warm-up to the end (the bounds apply to it),
    0 for one killed or started mid-run (figures reported, no baseline to hold them to)."""
    out: dict[str, dict[str, float]] = {}
    last = max((r.t for r in readings), default=0.0)
    for name in sorted({r.name for r in readings}):
        mine = [r for r in readings if r.name == name]
        bounded = mine[0].t <= warm_until and mine[-1].t >= last - 2.0
        warm = [r for r in mine if r.t <= warm_until][-5:] or mine[:1]
        later = [r for r in mine if r.t > warm_until] or mine[-1:]
        end = mine[-5:]
        rss0 = statistics.median(r.rss_mib for r in warm)
        fd0 = statistics.median(r.fds for r in warm)
        rss1 = statistics.median(r.rss_mib for r in end)
        # RSS over the second half of the load (after warm-up): a leak keeps rising, a high-water
        # mark levels off. 0 when there is no such window.
        stop = load_end if load_end is not None else last
        mid = (warm_until + stop) / 2
        first = [r.rss_mib for r in mine if r.t <= mid][-5:]
        second = [r.rss_mib for r in mine if r.t <= stop][-5:]
        half = statistics.median(second) - statistics.median(first) if first and second else 0.0
        fd1 = statistics.median(r.fds for r in end)
        out[name] = {
            "rss_warm_mib": rss0,
            "rss_peak_mib": max(r.rss_mib for r in later),
            "rss_end_mib": rss1,
            "rss_growth_mib": rss1 - rss0,
            "rss_second_half_mib": half,
            "rss_bound_mib": max(RSS_BOUND_MIB, RSS_BOUND_FRACTION * rss0),
            "fds_warm": fd0,
            "fds_peak": max(r.fds for r in later),
            "fds_end": fd1,
            "fds_growth": fd1 - fd0,
            "bounded": float(bounded),
        }
    return out


def timeline(readings: list[ProcSample], every: float = 10.0) -> list[str]:
    """'t s: name rss/fds, ...' at the first reading of each `every`-second slot."""
    slots: dict[int, dict[str, ProcSample]] = {}
    for r in readings:
        slots.setdefault(int(r.t // every), {}).setdefault(r.name, r)
    return [
        f"{k * every:.0f} s: "
        + ", ".join(f"{n} {r.rss_mib:.0f} MiB / {r.fds} fds" for n, r in sorted(x.items()))
        for k, x in sorted(slots.items())
    ]


def summarize(
    samples: list[Sample],
    readings: list[ProcSample],
    warm_until: float,
    cosines: list[float],
    queue_after: dict[str, dict[str, float]],
    load_end: float | None = None,
) -> Summary:
    counts: dict[str, dict[str, int]] = {}
    for s in samples:
        phase = counts.setdefault(s.phase, {"sent": 0, "ok": 0, "refused": 0, "failed": 0})
        phase["sent"] += 1
        phase[s.outcome] += 1
    # numbers masked so that "64756 tokens queued; retry in 16 s" answers group as one kind
    by_bucket: dict[str, dict[str, int]] = {}
    for s in samples:
        if s.phase == "load":
            row = by_bucket.setdefault(bucket_of(s.tokens), {"sent": 0, "ok": 0, "refused": 0, "failed": 0})
            row["sent"] += 1
            row[s.outcome] += 1
    statuses = Counter(f"{s.status}: {_DIGITS.sub('N', s.error[:70])}" for s in samples if s.status != 200)
    resources = growth(readings, warm_until, load_end)
    bounded = [r for r in resources.values() if r["bounded"]]
    wrong = sum(c < COSINE_BAR for c in cosines)
    cosine = {"checked": len(cosines), "min": min(cosines, default=float("nan")), "wrong": wrong}
    checks = {
        "every request has an HTTP status": not any(s.status == 0 for s in samples),
        "every 429 carries Retry-After": all(s.retry_after for s in samples if s.status == 429),
        "vectors checked and right": bool(cosines) and wrong == 0,
        "RSS growth within bound": all(r["rss_growth_mib"] <= r["rss_bound_mib"] for r in bounded),
        "fd growth within bound": all(r["fds_growth"] <= FD_BOUND for r in bounded),
        "queues empty after": all(v == 0 for gauges in queue_after.values() for v in gauges.values()),
    }
    return Summary(
        counts=counts,
        by_bucket={b: by_bucket[b] for b in BUCKET_NAMES if b in by_bucket},
        statuses=dict(statuses.most_common()),
        no_status=sum(s.status == 0 for s in samples),
        latency=latency_table(samples),
        resources=resources,
        timeline=timeline(readings),
        cosine=cosine,
        queue_after=queue_after,
        checks=checks,
    )


def as_json(summary: Summary, meta: dict[str, Any]) -> dict[str, Any]:
    return {"meta": meta, **asdict(summary)}


def markdown(summary: Summary, meta: dict[str, Any]) -> str:
    lines = [f"# Soak run: through {meta['through']}", "", f"Command: `{meta['command']}`", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("through", "command")]
    lines += [
        "",
        "## Outcomes",
        "",
        "| phase | sent | ok | refused (429 + Retry-After) | failed |",
        "|---|---|---|---|---|",
    ]
    for phase, c in summary.counts.items():
        lines.append(f"| {phase} | {c['sent']} | {c['ok']} | {c['refused']} | {c['failed']} |")
    lines += ["", "Load phase by length bucket:", "", "| bucket | sent | ok | refused | failed |"]
    lines += ["|---|---|---|---|---|"]
    for bucket, c in summary.by_bucket.items():
        lines.append(f"| {bucket} | {c['sent']} | {c['ok']} | {c['refused']} | {c['failed']} |")
    lines += ["", "Answers other than 200 (status: first words of the message):", ""]
    lines += [f"- {k} — {n}" for k, n in summary.statuses.items()] or ["- none"]
    lines += [f"- without any HTTP status (transport error / client timeout): {summary.no_status}"]
    c = summary.cosine
    lines += ["", "## Vectors", "", f"{c['checked']} answered vectors re-embedded in-process after the run "
              f"(fp32, idle): min cosine {c['min']:.7f}, below {COSINE_BAR}: {c['wrong']}."]  # fmt: skip
    lines += ["", "## Latency of successful requests (ms, per length bucket)", ""]
    lines += ["| phase | bucket | n | p50 | p99 |", "|---|---|---|---|---|"]
    for phase, rows in summary.latency.items():
        for bucket, r in rows.items():
            lines.append(f"| {phase} | {bucket} | {r['n']:.0f} | {r['p50_ms']:,.0f} | {r['p99_ms']:,.0f} |")
    lines += ["", "## Server processes (psutil, every second)", ""]
    lines += ["Bounds (n/a: a process killed or started mid-run has no warm-up baseline):", ""]
    lines += [
        "| process | RSS warm MiB | peak | end | growth (bound) | 2nd half of load | fds warm | peak | end |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary.resources.items():
        lines.append(
            f"| {name} | {r['rss_warm_mib']:.0f} | {r['rss_peak_mib']:.0f} | {r['rss_end_mib']:.0f} | "
            f"{r['rss_growth_mib']:+.1f} ({r['rss_bound_mib']:.0f} MiB{'' if r['bounded'] else ', n/a'}) | "
            f"{r['rss_second_half_mib']:+.1f} | {r['fds_warm']:.0f} | "
            f"{r['fds_peak']:.0f} | {r['fds_end']:.0f} |"
        )
    lines += [
        "",
        "RSS / open fds over time (seconds since the start; the load phase is in the meta above):",
        "",
    ]
    lines += [f"- {t}" for t in summary.timeline]
    lines += ["", "## Queues after the idle period (/metrics gauges)", ""]
    for name, gauges in summary.queue_after.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v:g}" for k, v in gauges.items()))
    lines += ["", "## Checks", ""]
    lines += [f"- [{'x' if ok else ' '}] {name}" for name, ok in summary.checks.items()]
    return "\n".join(lines) + "\n"
