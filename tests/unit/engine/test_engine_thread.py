"""The engine loop's thread builds the model and runs it: one thread starts every parallel CPU
op, so the process keeps one OpenMP pool (engine/loop.py says why that matters)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from embedserve import Engine
from embedserve.engine import engine as engine_module
from embedserve.engine.builder import EngineParts, build_engine
from embedserve.engine.core import EngineCore, Finished
from embedserve.errors import ModelLoadError
from tests.helpers.reference import random_ids


def test_the_model_is_built_on_the_thread_that_runs_it(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builders: list[int] = []
    steppers: set[int] = set()

    def build(*args: object, **kwargs: object) -> EngineParts:
        builders.append(threading.get_ident())
        return build_engine(*args, **kwargs)  # type: ignore[arg-type]

    step = EngineCore.step

    def recorded_step(
        self: EngineCore, publish: Callable[[list[Finished]], None] | None = None
    ) -> list[Finished]:
        steppers.add(threading.get_ident())
        return step(self, publish)

    monkeypatch.setattr(engine_module, "build_engine", build)
    monkeypatch.setattr(EngineCore, "step", recorded_step)
    engines: list[Engine] = []

    def load() -> None:
        engines.append(Engine.from_pretrained(qwen3_dir, max_model_len=256, max_num_batched_tokens=64))

    loader = threading.Thread(target=load)  # the server loads from a worker thread too
    loader.start()
    loader.join()
    with engines[0] as engine:
        vecs = engine.embed([random_ids(200, seed=1), random_ids(30, seed=2)])
    assert vecs.shape == (2, 64)
    assert len(builders) == 1 and steppers == {builders[0]}
    assert builders[0] not in (loader.ident, threading.get_ident())


def test_a_failed_build_raises_from_the_constructor_and_ends_the_thread() -> None:
    before = {t.ident for t in threading.enumerate()}

    def broken() -> EngineParts:
        raise ModelLoadError("the model directory is missing")

    with pytest.raises(ModelLoadError, match="the model directory is missing"):
        Engine(broken)
    for t in [t for t in threading.enumerate() if t.ident not in before]:
        t.join(5)
        assert not t.is_alive(), f"{t.name} still running"


def test_parts_built_elsewhere_still_run(qwen3_dir: Path) -> None:
    parts = build_engine(qwen3_dir, max_model_len=256, max_num_batched_tokens=64)
    with Engine(parts) as engine:
        assert engine.embed([random_ids(40, seed=3)]).shape == (1, 64)
        assert engine.alive
    assert not engine.alive


def test_one_calls_inputs_reach_the_loop_together(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call's inputs are posted to the loop thread as one item: the first step sees them all,
    however slowly the calling thread gets through them (here 30 ms per input). Posted one by
    one, the loop woke at the first and stepped it alone."""
    from embedserve.engine import loop

    class SlowFuture(loop.Future):  # type: ignore[type-arg]
        def __init__(self) -> None:
            time.sleep(0.03)
            super().__init__()

    monkeypatch.setattr(loop, "Future", SlowFuture)
    with Engine.from_pretrained(qwen3_dir, max_model_len=256, max_num_batched_tokens=256) as engine:
        engine.embed([random_ids(8, seed=1)])  # the loop thread is up and idle
        before = engine.stats()["steps"]
        vecs = engine.embed([random_ids(20, seed=s) for s in range(2, 6)])
        assert engine.stats()["steps"] - before == 1
    assert vecs.shape == (4, 64)
