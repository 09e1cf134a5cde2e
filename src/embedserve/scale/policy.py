"""Autoscaling on queued tokens per replica, not on request counts.

One request can be 30 tokens or 16K, so "ongoing requests" says little about how busy a replica
is. Each replica reports the tokens it has admitted and not yet answered (`queued_tokens`); a
pool wants enough replicas that each holds at most its target:

    desired = clamp(ceil(sum(queued_tokens over replicas) / target_queued_tokens), min, max)

A change of the replica count waits until the same direction has been wanted for
`upscale_delay_s` / `downscale_delay_s` (a burst does not start a replica, a lull does not stop
one). `decide` is a pure function of its inputs; `QueuedTokensPolicy` adapts it to Ray Serve's
custom autoscaling policy API. Ray pickles this module by value into its controller, so it
imports nothing outside the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

QUEUED_TOKENS = "queued_tokens"  # the metric name replicas report (record_autoscaling_stats)
_DIRECTION = "embedserve_direction"  # policy state keys (Ray keeps its own keys beside them)
_SINCE = "embedserve_since"


@dataclass(frozen=True)
class ScalingParams:
    target_queued_tokens: float
    min_replicas: int
    max_replicas: int
    upscale_delay_s: float
    downscale_delay_s: float


def desired_replicas(queued_tokens: Mapping[str, float], params: ScalingParams) -> int:
    """Replicas needed so that each holds at most the target, within [min, max]."""
    total = sum(max(0.0, q) for q in queued_tokens.values())
    wanted = math.ceil(total / params.target_queued_tokens)
    return max(params.min_replicas, min(params.max_replicas, wanted))


def decide(
    queued_tokens: Mapping[str, float],
    current: int,
    params: ScalingParams,
    now: float,
    state: Mapping[str, Any],
) -> tuple[int, dict[str, Any]]:
    """(replica count to run, state for the next call). `current`: the count now targeted;
    `queued_tokens`: per running replica (the ones that reported); `state`: last call's."""
    wanted = desired_replicas(queued_tokens, params)
    if wanted == current:
        return current, {}
    direction = 1 if wanted > current else -1
    since = state.get(_SINCE) if state.get(_DIRECTION) == direction else None
    since = now if since is None else float(since)
    delay = params.upscale_delay_s if direction > 0 else params.downscale_delay_s
    if now - since >= delay:
        return wanted, {}
    return current, {_DIRECTION: direction, _SINCE: since}


class QueuedTokensPolicy:
    """Ray Serve custom autoscaling policy (`AutoscalingPolicy(policy_function=<this class>,
    policy_kwargs=...)`): Ray builds it once per deployment and calls it every control tick with
    an AutoscalingContext. Ray's own delays are set to 0 for it: `decide` applies the pool's."""

    def __init__(
        self,
        target_queued_tokens: float,
        min_replicas: int,
        max_replicas: int,
        upscale_delay_s: float,
        downscale_delay_s: float,
    ) -> None:
        self.params = ScalingParams(
            float(target_queued_tokens), int(min_replicas), int(max_replicas),
            float(upscale_delay_s), float(downscale_delay_s),
        )  # fmt: skip

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        per_replica = {str(rid): float(v) for rid, v in metrics.get(QUEUED_TOKENS, {}).items()}
        now = ctx.current_time if ctx.current_time is not None else _now()
        own = {k: v for k, v in ctx.policy_state.items() if k in (_DIRECTION, _SINCE)}
        return decide(per_replica, ctx.target_num_replicas, self.params, now, own)


def _now() -> float:
    import time

    return time.time()
