"""Backpressure accounting, throughput estimate, warm-up shapes."""

from __future__ import annotations

import pytest

from embedserve.errors import ModelLoadError
from embedserve.server.admission import Admission, ThroughputMeter
from embedserve.server.warmup import full_step_lengths, warmup_shapes


def test_a_request_is_admitted_whole_or_not_at_all() -> None:
    a = Admission(max_inputs=4, max_tokens=100, meter=ThroughputMeter())
    first = a.try_admit(3, 60)
    assert first is not None and (a.inputs, a.tokens) == (3, 60)
    assert a.try_admit(2, 10) is None  # 5 inputs > 4: refused, nothing partially held
    assert a.try_admit(1, 41) is None  # 101 tokens > 100
    assert (a.inputs, a.tokens) == (3, 60)
    second = a.try_admit(1, 40)
    assert second is not None and (a.inputs, a.tokens) == (4, 100)
    a.release(first)
    a.release(second)
    assert (a.inputs, a.tokens) == (0, 0)


def test_requests_larger_than_the_bound_are_told_apart_from_a_busy_server() -> None:
    a = Admission(max_inputs=4, max_tokens=100, meter=ThroughputMeter())
    assert a.fits_ever(4, 100)
    assert not a.fits_ever(5, 1) and not a.fits_ever(1, 101)
    with pytest.raises(ValueError):
        Admission(0, 10, ThroughputMeter())


def test_retry_after_follows_the_measured_throughput() -> None:
    meter = ThroughputMeter(window_s=10.0)
    a = Admission(max_inputs=10, max_tokens=10_000, meter=meter)
    assert a.retry_after() == 1  # nothing measured yet: retry soon
    a.try_admit(1, 5000)
    meter.add(1000)  # 1000 tokens over the (minimum) 1 s span -> 5 s to drain 5000
    assert a.retry_after() == 5
    a.try_admit(1, 5000)
    assert a.retry_after() == 10


def test_throughput_meter_forgets_old_events() -> None:
    meter = ThroughputMeter(window_s=10.0)
    meter.add(500, now=100.0)
    meter.add(500, now=104.0)
    assert meter.rate(now=105.0) == pytest.approx(1000 / 5.0)
    assert meter.rate(now=112.0) == pytest.approx(500 / 8.0)  # the first event expired
    assert meter.rate(now=200.0) == 0.0


def test_warm_up_fills_one_whole_step_and_checks_lengths() -> None:
    assert full_step_lengths(2048, 8192) == [2048]
    assert full_step_lengths(2048, 512) == [512] * 4
    assert full_step_lengths(1000, 300) == [300, 300, 300, 100]
    assert warmup_shapes((16, 512), 2048, 8192) == [[16], [512], [2048]]
    assert warmup_shapes(None, 2048, 256) == [[16], [256], [256] * 8]  # defaults fit the model
    with pytest.raises(ModelLoadError, match="warm-up length 9000"):
        warmup_shapes((9000,), 2048, 8192)
