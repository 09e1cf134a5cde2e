"""A tensor-parallel worker that dies: killed in the middle of a step (between two layers'
all-reduces) or while the engine is idle. Requests in flight fail naming the rank and the
signal, the engine reports dead, nothing hangs, and every worker process is gone after close."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from embedserve import Engine
from embedserve.engine.options import EngineOptions
from embedserve.errors import EngineDeadError
from embedserve.parallel.runner import TensorParallelRunner
from tests.helpers.engine_calls import submit
from tests.helpers.reference import random_ids

DEADLINE_S = 30.0  # "nothing hangs": every wait below is bounded by this


def _workers(engine: Engine) -> TensorParallelRunner:
    workers = engine._loop.parts.workers
    assert workers is not None
    return workers


def _wait_dead(engine: Engine) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while engine.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not engine.alive


def _assert_closed(engine: Engine, workers: TensorParallelRunner) -> None:
    start = time.monotonic()
    engine.close()
    assert time.monotonic() - start < DEADLINE_S
    assert all(w.process.exitcode is not None for w in workers.workers)
    with pytest.raises(EngineDeadError):
        engine.embed([[1, 2, 3]])


def test_worker_killed_mid_step(qwen3_dir: Path) -> None:
    engine = Engine.from_pretrained(qwen3_dir, tensor_parallel_size=2, max_num_batched_tokens=256)
    workers = _workers(engine)
    victim = workers.workers[0].process
    layer: Any = workers.model.layers[1]
    forward = layer.forward

    def kill_then_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        """Rank 0 is past layer 0's all-reduces; layer 1's first one meets a dead peer."""
        if victim.exitcode is None:
            os.kill(victim.pid or 0, signal.SIGKILL)
            victim.join(DEADLINE_S)
        return forward(*args, **kwargs)  # type: ignore[no-any-return]

    engine.embed([random_ids(100, seed=1)])  # a step that works first
    layer.forward = kill_then_forward
    futures, _ = submit(engine, [random_ids(1000, seed=2), random_ids(50, seed=3)])
    for fut in futures:
        with pytest.raises(EngineDeadError, match=r"rank 1 \(pid \d+\) was killed by signal 9 \(SIGKILL\)"):
            fut.result(timeout=DEADLINE_S)
    _wait_dead(engine)
    _assert_closed(engine, workers)


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_worker_dying_while_idle_marks_the_engine_dead(qwen3_dir: Path) -> None:
    engine = Engine.from_pretrained(qwen3_dir, tensor_parallel_size=2)
    workers = _workers(engine)
    assert engine.embed([[1, 2, 3]]).shape == (1, 64)
    os.kill(workers.worker_pids[0], signal.SIGTERM)
    _wait_dead(engine)  # seen by the watcher, no request needed
    with pytest.raises(EngineDeadError, match=r"rank 1 .*signal 15 \(SIGTERM\)"):
        engine.embed([[1, 2, 3]])
    _assert_closed(engine, workers)


_SCRIPT = """
import os, signal, sys, time
from embedserve import Engine
from embedserve.errors import EngineDeadError
if __name__ == "__main__":
    engine = Engine.from_pretrained(sys.argv[1], tensor_parallel_size=2)
    workers = engine._loop.parts.workers
    print("pids", os.getpid(), *workers.worker_pids, flush=True)
    futures = engine.submit(engine.prepare([[1] * 3000]))
    os.kill(workers.worker_pids[0], signal.SIGKILL)
    try:
        futures[0].result(timeout=30)
    except EngineDeadError as e:
        print("failed:", e, flush=True)
    # no close(): the interpreter's own exit must not hang on the engine or its workers
"""


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_the_driver_process_exits_cleanly_after_a_worker_died(qwen3_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(script), str(qwen3_dir)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any("failed: engine stopped: tensor-parallel worker rank 1" in line for line in lines), done.stdout
    pids = [int(p) for p in next(line for line in lines if line.startswith("pids")).split()[1:]]
    for pid in pids:  # the driver and its workers are all gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_a_dropped_runner_stops_its_workers(qwen3_dir: Path) -> None:
    """An engine whose build fails after the workers started never gets closed: dropping
    the runner stops them."""
    from embedserve.models.loader import read_model_dir
    from embedserve.parallel.setup import start_parallel

    runner = start_parallel(read_model_dir(qwen3_dir), 2, 8, 16, torch.float32, torch.device("cpu"))
    procs = [w.process for w in runner.workers]
    del runner
    gc.collect()
    assert all(p.exitcode == 0 for p in procs)


@pytest.mark.slow
def test_server_reports_not_ready_then_rebuilds_the_ranks(qwen3_dir: Path) -> None:
    from tests.helpers.inprocess import runtime_of, server_client

    with server_client(qwen3_dir, engine=EngineOptions(tensor_parallel_size=2)) as client:
        engine = runtime_of(client).engine
        assert engine is not None
        os.kill(_workers(engine).worker_pids[0], signal.SIGKILL)
        _wait_dead(engine)
        statuses = []
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            statuses.append(client.get("/health/ready").status_code)
            if statuses[-1] == 200:
                break
            time.sleep(0.05)
        assert 503 in statuses and statuses[-1] == 200  # dead, then a fresh engine and ranks
        fresh = runtime_of(client).engine
        assert fresh is not engine and fresh is not None and fresh.alive
        body = client.post("/v1/embeddings", json={"input": "hello", "model": "qwen3"}).json()
        assert body["backend_profile"] == "cpu-fp32-tp2" and len(body["data"]) == 1
