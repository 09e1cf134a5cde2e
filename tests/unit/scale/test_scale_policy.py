"""The queued-tokens autoscaling policy on fabricated replica reports (no Ray)."""

from __future__ import annotations

from types import SimpleNamespace

from embedserve.scale.policy import QUEUED_TOKENS, QueuedTokensPolicy, ScalingParams, decide, desired_replicas

P = ScalingParams(
    target_queued_tokens=1000, min_replicas=1, max_replicas=4, upscale_delay_s=2, downscale_delay_s=10
)


def test_desired_replicas_follow_tokens_not_requests() -> None:
    assert desired_replicas({}, P) == 1  # nothing reported: the floor
    assert desired_replicas({"a": 0.0}, P) == 1
    assert desired_replicas({"a": 1000.0}, P) == 1
    assert desired_replicas({"a": 1001.0}, P) == 2
    # One 16K document outweighs many short queries: tokens decide, not request counts.
    assert desired_replicas({"a": 16_000.0}, P) == 4  # capped at max
    assert desired_replicas({"a": 900.0, "b": 900.0, "c": 10.0}, P) == 2
    assert desired_replicas({"a": -5.0}, P) == 1  # a bogus negative report counts as idle


def test_scale_up_waits_for_the_delay_then_jumps() -> None:
    queued = {"a": 2500.0}
    n, state = decide(queued, 1, P, now=100.0, state={})
    assert n == 1 and state  # wanted 3, waiting
    n, state = decide(queued, 1, P, now=101.0, state=state)
    assert n == 1
    n, state = decide(queued, 1, P, now=102.0, state=state)
    assert n == 3 and state == {}


def test_a_change_of_mind_restarts_the_clock() -> None:
    n, state = decide({"a": 2500.0}, 2, P, now=0.0, state={})
    assert n == 2
    n, state = decide({"a": 10.0}, 2, P, now=1.0, state=state)  # now it wants fewer
    assert n == 2
    n, state = decide({"a": 10.0}, 2, P, now=10.5, state=state)  # 9.5 s of wanting fewer
    assert n == 2
    n, state = decide({"a": 10.0}, 2, P, now=11.0, state=state)
    assert n == 1 and state == {}


def test_steady_load_keeps_the_count_and_forgets_pending_moves() -> None:
    _, state = decide({"a": 2500.0}, 2, P, now=0.0, state={})
    n, state = decide({"a": 1500.0, "b": 100.0}, 2, P, now=1.0, state=state)
    assert (n, state) == (2, {})


def test_ray_adapter_reads_aggregated_metrics_and_keeps_only_its_state() -> None:
    policy = QueuedTokensPolicy(1000, 1, 4, 0, 0)
    ctx = SimpleNamespace(
        aggregated_metrics={QUEUED_TOKENS: {"r1": 1800.0, "r2": 1700.0}},
        target_num_replicas=2,
        current_time=5.0,
        policy_state={"ray-internal": 3},
    )
    assert policy(ctx) == (4, {})
    ctx.aggregated_metrics = None  # replicas have not reported yet
    assert policy(ctx) == (1, {})
