"""After a batched forward pass fails: find the request(s) whose input makes it fail.

A step packs many requests' chunks into one forward pass, so one input that trips the model
(a kernel fault on some token, a NaN check, ...) would fail every request that shares its step.
After such a failure the step's chunks are re-run in halves (bisection): a half that runs gives
its requests' rows (the same positions and KV slots as the failed pass: its partial KV writes
are overwritten with the same values), a half that fails is split again, down to one chunk,
whose request is then the one that fails.

    [a b c d] fails -> [a b] ok, [c d] fails -> [c] ok, [d] fails: only d's request fails

Bounded: at most `max_reruns(n)` re-runs, enough to find two failing chunks among n (2 re-runs
per halving, for each). An engine that fails every pass (a broken device, a bug) therefore
fails the whole step after a few more tries, and its requests fail as before (500; readiness
then needs a probe to pass).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from embedserve.errors import EngineDeadError
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput

Execute = Callable[[SchedulerOutput], dict[int, torch.Tensor]]


@dataclass
class Isolated:
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # request_id -> pooled rows
    failed: dict[int, Exception] = field(default_factory=dict)  # request_id -> its error
    reruns: int = 0


def max_reruns(num_chunks: int) -> int:
    """Re-runs allowed after a step of `num_chunks` failed: two per halving level, twice."""
    return 4 * (num_chunks - 1).bit_length()


def isolate(execute: Execute, out: SchedulerOutput, error: Exception) -> Isolated:
    """Re-run the failed step `out` by halves; `error` is what its whole pass raised."""
    result = Isolated()
    budget = max_reruns(len(out.chunks))
    failing: list[tuple[list[ScheduledChunk], Exception]] = [(list(out.chunks), error)]
    while failing:
        group, err = failing.pop()
        if len(group) == 1:
            result.failed[group[0].request_id] = err
            continue
        mid = len(group) // 2
        for half in (group[:mid], group[mid:]):
            if result.reruns >= budget:
                # Out of tries: most likely nothing would run; fail what is left as it failed.
                result.failed.update((c.request_id, err) for c in half)
                continue
            result.reruns += 1
            try:
                rows = execute(dataclasses.replace(out, chunks=half, preempted_ids=[], lane=None))
            except EngineDeadError:  # the runner is gone (a tensor-parallel rank died): no more tries
                raise
            except Exception as e:
                failing.append((half, e))
            else:
                result.rows.update(rows)
    return result
