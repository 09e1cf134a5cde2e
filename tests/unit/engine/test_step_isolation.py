"""A forward pass that fails because of one request's input fails that request only: the
core re-runs the failed step by halves (engine/isolate.py), the others get the vectors an
undisturbed run gives; an engine that fails every pass still fails fast (bounded re-runs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve import Engine
from embedserve.engine.isolate import isolate, max_reruns
from embedserve.errors import EngineDeadError, InternalEngineError
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput
from tests.helpers.engine_calls import submit
from tests.helpers.reference import cosine, random_ids

POISON = 4242  # the token id the injected fault looks for
BLOCKER = 4243  # the token id of the request that holds the engine (Gate)


@pytest.fixture(scope="module")
def engine(qwen3_dir: Path) -> Iterator[Engine]:
    with Engine.from_pretrained(qwen3_dir, max_model_len=512) as e:
        yield e


def _inputs(poisoned: tuple[int, ...]) -> list[list[int]]:
    seqs = [random_ids(20 + 3 * i, seed=100 + i) for i in range(8)]
    for i in poisoned:
        seqs[i] = [*seqs[i][:10], POISON, *seqs[i][10:]]
    return seqs


class Gate:
    """Holds the engine in a step of its own (a BLOCKER request) while a test's requests are
    queued, so that they all land in the next step together."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()


def _inject(engine: Engine, monkeypatch: pytest.MonkeyPatch, always: bool = False) -> tuple[list[int], Gate]:
    """The runner raises on any pass holding a POISON token (or on every pass but the gate's);
    returns the number of chunks of each pass tried, and the gate."""
    runner = engine._loop.core.runner
    real = runner.execute
    passes: list[int] = []
    gate = Gate()

    def execute(out: Any) -> Any:
        if any(BLOCKER in c.token_ids for c in out.chunks):
            gate.entered.set()
            gate.release.wait(30)
            return real(out)
        passes.append(len(out.chunks))
        if always or any(POISON in c.token_ids for c in out.chunks):
            raise RuntimeError("injected device fault")
        return real(out)

    monkeypatch.setattr(runner, "execute", execute)
    return passes, gate


def _settle(engine: Engine, seqs: list[list[int]], gate: Gate) -> list[np.ndarray | Exception]:
    blocker, _ = submit(engine, [[1, 2, BLOCKER]])
    assert gate.entered.wait(30)
    futures, _ = submit(engine, seqs)  # queued while the engine is in the blocker's step
    gate.release.set()
    blocker[0].result(timeout=60)
    out: list[np.ndarray | Exception] = []
    for f in futures:
        try:
            vector = f.result(timeout=60).vector
            assert vector is not None
            out.append(vector.numpy())
        except InternalEngineError as e:
            out.append(e)
    return out


@pytest.mark.parametrize("poisoned", [(3,), (1, 6)])
def test_only_the_failing_inputs_fail_and_the_rest_get_undisturbed_vectors(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, poisoned: tuple[int, ...]
) -> None:
    seqs = _inputs(poisoned)
    clean = [s for i, s in enumerate(seqs) if i not in poisoned]
    reference = engine.embed(clean)  # undisturbed run, same inputs
    passes, gate = _inject(engine, monkeypatch)
    got = _settle(engine, seqs, gate)
    assert passes[0] == 8, passes  # all eight shared the failing step
    assert 1 < len(passes) <= 1 + max_reruns(8)
    for i in poisoned:
        assert isinstance(got[i], InternalEngineError) and "injected device fault" in str(got[i])
    vectors = [v for i, v in enumerate(got) if i not in poisoned]
    assert all(isinstance(v, np.ndarray) for v in vectors), got
    assert min(cosine(np.stack(vectors), reference)) >= 0.99999  # type: ignore[arg-type]
    assert engine.stats()["kv_blocks_used"] == 0


def test_an_engine_that_fails_every_pass_fails_the_step_after_bounded_reruns(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes, gate = _inject(engine, monkeypatch, always=True)
    got = _settle(engine, _inputs(()), gate)
    assert all(isinstance(g, InternalEngineError) for g in got), got
    assert len(passes) == 1 + max_reruns(8) == 13  # then it stops trying
    monkeypatch.undo()
    assert engine.alive and engine.stats()["kv_blocks_used"] == 0
    assert np.isfinite(engine.embed([random_ids(30, seed=1)])).all()  # the engine goes on


def test_a_lone_failing_request_is_not_rerun(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    passes, gate = _inject(engine, monkeypatch)
    got = _settle(engine, [[1, 2, POISON]], gate)
    assert isinstance(got[0], InternalEngineError) and passes == [1]


@pytest.mark.parametrize(
    ("n", "bad", "reruns"), [(8, {3}, 6), (8, {1, 6}, 10), (64, {5}, 12), (64, {5, 40}, 22), (2, {1}, 2)]
)
def test_bisection_finds_the_failing_chunks_within_its_bound(n: int, bad: set[int], reruns: int) -> None:
    chunks = [ScheduledChunk(i, 0, [i], [], (0, 1)) for i in range(n)]

    def execute(out: SchedulerOutput) -> dict[int, Any]:
        if any(c.request_id in bad for c in out.chunks):
            raise RuntimeError("bad chunk")
        return {c.request_id: c.request_id for c in out.chunks}

    found = isolate(execute, SchedulerOutput(0, chunks), RuntimeError("bad chunk"))
    assert sorted(found.failed) == sorted(bad) and sorted(found.rows) == sorted(set(range(n)) - bad)
    assert found.reruns == reruns <= max_reruns(n)


def test_a_runner_that_died_is_not_bisected() -> None:
    """A dead runner (a tensor-parallel rank gone) cannot run any half: stop at once."""
    chunks = [ScheduledChunk(i, 0, [i], [], (0, 1)) for i in range(8)]
    calls = []

    def execute(out: SchedulerOutput) -> dict[int, Any]:
        calls.append(len(out.chunks))
        raise EngineDeadError("tensor-parallel rank 1 died")

    with pytest.raises(EngineDeadError, match="rank 1 died"):
        isolate(execute, SchedulerOutput(0, chunks), RuntimeError("first failure"))
    assert calls == [4]
