"""The soak tool's report math (benchmarks/soak/report.py) on fabricated samples, and its load mix."""

from __future__ import annotations

import random

import pytest

from benchmarks.soak.load import MAX_TOKENS, MIN_TOKENS, Recorder, draw_job
from benchmarks.soak.report import FD_BOUND, ProcSample, Sample, markdown, percentile, summarize


def _samples() -> list[Sample]:
    out = [Sample(float(i), float(i) + 0.01 * (i + 1), 100, "online", "load", 200) for i in range(100)]
    out += [Sample(0.0, 2.0, 5000, "batch", "load", 200), Sample(0.0, 4.0, 5000, "batch", "load", 200)]
    out += [Sample(1.0, 1.001, 9000, "batch", "load", 429, True, "server is at capacity (64756 tokens)")]
    out += [Sample(1.0, 1.002, 9000, "batch", "load", 429, True, "server is at capacity (1 tokens)")]
    out += [Sample(2.0, 2.5, 300, "online", "load", 503, True, "pool 'long' is not ready")]
    out += [Sample(200.0, 200.05, 20, "online", "after", 200)]
    return out


def _readings(rss_end: float, fds_end: int) -> list[ProcSample]:
    warm = [ProcSample(float(t), "server", 500.0 + t, 20) for t in range(10)]  # grows during warm-up
    later = [ProcSample(float(t), "server", 520.0, 30) for t in range(10, 50)]
    end = [ProcSample(float(t), "server", rss_end, fds_end) for t in range(50, 55)]
    return warm + later + end


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0


def test_outcomes_latency_buckets_and_checks() -> None:
    queues = {"server": {"admitted_inputs": 0.0, "admitted_tokens": 0.0}}
    restarted = [ProcSample(float(t), "pool (restarted)", 6.0 + 20 * t, 3 + t) for t in range(30, 55)]
    s = summarize(_samples(), _readings(530.0, 21) + restarted, 9.0, [1.0, 0.999995], queues, 49.0)
    assert s.resources["pool (restarted)"]["bounded"] == 0  # started mid-run: no baseline to hold to
    assert s.counts["load"] == {"sent": 105, "ok": 102, "refused": 2, "failed": 1}
    assert s.counts["after"] == {"sent": 1, "ok": 1, "refused": 0, "failed": 0}
    assert s.statuses == {
        "429: server is at capacity (N tokens)": 2,
        "503: pool 'long' is not ready": 1,
    }
    load = s.latency["load"]
    assert set(load) == {"0-1K", "4K-8K"}  # buckets apart; refused and failed requests not timed
    assert load["0-1K"] == pytest.approx({"n": 100, "p50_ms": 500.0, "p99_ms": 990.0})
    assert load["4K-8K"] == {"n": 2, "p50_ms": 2000.0, "p99_ms": 4000.0}
    r = s.resources["server"]
    assert r["rss_warm_mib"] == 507.0 and r["rss_peak_mib"] == 530.0 and r["rss_growth_mib"] == 23.0
    assert r["rss_second_half_mib"] == 0.0  # levelled off at 520 MiB during the load
    assert r["fds_warm"] == 20 and r["fds_peak"] == 30 and r["fds_growth"] == 1
    assert s.cosine == {"checked": 2, "min": 0.999995, "wrong": 0}
    assert all(s.checks.values()), s.checks
    text = markdown(s, {"through": "server", "command": "run.py"})
    assert "| load | 0-1K | 100 | 500 | 990 |" in text and "- [x] queues empty after" in text


def test_checks_fail_on_wrong_vectors_growth_silent_losses_and_busy_queues() -> None:
    samples = [*_samples(), Sample(3.0, 183.0, 16000, "batch", "load", 0, False, "ReadTimeout")]
    samples.append(Sample(3.0, 3.1, 20, "online", "load", 429, False, "no Retry-After"))
    queues = {"server": {"admitted_inputs": 1.0}}
    s = summarize(samples, _readings(900.0, 21 + FD_BOUND + 1), 9.0, [1.0, 0.9], queues)
    assert s.no_status == 1 and s.cosine["wrong"] == 1
    assert not any(s.checks.values()), s.checks


def test_load_mix_lengths_and_classes() -> None:
    rng = random.Random(0)
    jobs = [draw_job(rng, i) for i in range(2000)]
    assert min(j.tokens for j in jobs) >= MIN_TOKENS and max(j.tokens for j in jobs) <= MAX_TOKENS
    assert sum(j.tokens <= 1024 for j in jobs) > 1000  # log-uniform: most requests short
    short_online = sum(j.klass == "online" for j in jobs if j.tokens <= 1024)
    long_batch = sum(j.klass == "batch" for j in jobs if j.tokens > 1024)
    assert short_online > 0.7 * sum(j.tokens <= 1024 for j in jobs) and long_batch > 0
    rec = Recorder(0.0, keep_per_bucket=2)
    for j in jobs[:50]:
        rec.keep(j, [1.0, 0.0])
    assert 0 < len(rec.vectors) <= 2 * 8
