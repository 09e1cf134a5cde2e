"""One benchmark worker process: opens one target (at one token budget) and runs its cells.

The parent starts one worker per (target, token budget) so that targets never share a
process: peak memory is this process's own, and a crash or an OOM kill loses one group, not
the run. Results go to stdout as lines starting with `@@bench ` (anything else a library prints
is ignored by the parent).

    python -m embedserve.bench.worker JOB.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from embedserve.bench.cputime import CpuTime
from embedserve.bench.interference import run_interference
from embedserve.bench.load import closed_loop, describe, is_oom, timed
from embedserve.bench.memory import PeakMemory
from embedserve.bench.stats import Sample, samples_json
from embedserve.bench.target import Session, parse_target
from embedserve.bench.targets import open_target

PREFIX = "@@bench "


def emit(kind: str, **payload: Any) -> None:
    sys.stdout.write(PREFIX + json.dumps({"type": kind, **payload}) + "\n")
    sys.stdout.flush()


async def _cosine_vectors(session: Session, job: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Sequential, unloaded embeddings of the first texts of each workload, for cosine checks."""
    for key in dict.fromkeys(c["workload"] for c in job["cells"]):
        vectors = []
        for text in inputs[key]["texts"][: job["cosine_sample"]]:
            try:
                vectors.append((await session.embed(text, "online")).vector.tolist())
            except Exception:  # the matrix cell will record the error; no vector to compare
                vectors.append(None)
        emit("vectors", key=key, vectors=vectors)


async def _run_cells(session: Session, job: dict[str, Any], inputs: dict[str, Any], pid: int | None) -> None:
    for cell in job["cells"]:
        w = inputs[cell["workload"]]
        n = cell["requests"]
        before = session.counters()
        with PeakMemory(session.device, pid) as mem, CpuTime(session.device, pid) as cpu:
            samples, wall = await closed_loop(session, w["texts"][:n], w["tokens"][:n], cell["concurrency"])
        counters = {k: v - before.get(k, 0) for k, v in session.counters().items()}
        emit(
            "cell",
            id=cell["id"],
            wall_s=wall,
            samples=samples_json(samples),
            peak_mem=mem.peak,
            start_mem=mem.start,
            cpu_s=cpu.seconds,
            counters=counters,
        )


async def run_job(job: dict[str, Any]) -> None:
    spec = parse_target(job["target"])
    with open(job["inputs"], encoding="utf-8") as f:
        inputs: dict[str, Any] = json.load(f)
    pid = spec.int_option("pid")
    if job.get("threads"):
        import torch

        torch.set_num_threads(job["threads"])
    t0 = time.perf_counter()
    try:
        session = open_target(spec, job["token_budget"])
    except Exception as e:
        emit("open_failed", error=describe(e), oom=is_oom(e))
        return
    try:
        mem_method = PeakMemory(session.device, pid).method
        emit(
            "opened",
            load_s=time.perf_counter() - t0,
            device=session.device,
            mem_method=mem_method,
            threads=_torch_threads(session.device),
        )
        warm = await _warm_up(session, job["warmup"])
        if warm is not None:
            emit("open_failed", error=f"warm-up request failed: {warm.error}", oom=warm.oom)
            return
        if job.get("cosine_sample", 0) > 0:
            await _cosine_vectors(session, job, inputs)
        await _run_cells(session, job, inputs, pid)
        if job.get("interference"):
            emit("interference", **await run_interference(session, inputs, job["interference"], pid))
    finally:
        await session.aclose()


def _torch_threads(device: str) -> int | None:
    """Intra-op threads of this process: what in-process targets compute with."""
    if device == "remote":
        return None
    import torch

    return torch.get_num_threads()


async def _warm_up(session: Session, text: str, rounds: int = 3) -> Sample | None:
    """A few short requests so the first cell does not pay one-time costs (thread pools,
    kernel selection: the first calls are tens of times slower); the failure, if any."""
    for _ in range(rounds):
        s = await timed(session, text, 0, "online")
        if s.error is not None:
            return s
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m embedserve.bench.worker JOB.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    asyncio.run(run_job(job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
