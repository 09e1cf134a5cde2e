"""What a running batch job (the online batch API, `serve --batch-dir`) costs online queries on the
same server, and what online queries cost the job: one `embedserve serve` process, phases
alternated over rounds:

    online   short queries alone (open loop, Poisson arrivals at --rate per second)
    job      a batch job alone: its lines/s
    both     the same online load while the job runs: online p50 / p99 and the job's lines/s

    python benchmarks/batch_interference.py [--model DIR] [--rate 20] [--seconds 20] [--rounds 2]
        [--serve-args "--max-num-batched-tokens 1024"]

Each online query is a fresh text (no cache hits); job lines are 60-160 words. Medians over rounds.
Online load under the job starts after the job ran alone (no online work for `--seconds`): the
first `--settle` seconds of it are reported apart (their slowest query: the step a lull allows,
scheduler/policy.py LULL_STEP_S), the percentiles are the steady state after them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx

WORDS = ["the", "of", "engine", "batch", "token", "model", "vector", "query", "document", "server", "pool"]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def online_load(base: str, rate: float, seconds: float, seed: int) -> list[tuple[float, float]]:
    """(seconds since the load began, latency in ms) of Poisson arrivals at `rate`/s for
    `seconds`; every query a new text."""
    rng = random.Random(seed)
    latencies: list[tuple[float, float]] = []
    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:

        async def one(i: int) -> None:
            text = f"query {seed} {i} " + " ".join(rng.choices(WORDS, k=8))
            start = time.perf_counter()
            r = await client.post("/v1/embeddings", json={"input": text})
            r.raise_for_status()
            latencies.append((start - began, (time.perf_counter() - start) * 1000))

        await poisson(rate, seconds, rng, one)
    return latencies


async def poisson(
    rate: float, seconds: float, rng: random.Random, one: Callable[[int], Coroutine[Any, Any, None]]
) -> None:
    """`one(i)` started at Poisson arrivals of `rate` per second for `seconds`, then awaited."""
    tasks: list[asyncio.Task[None]] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)


def job_lines(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        body = {"input": f"doc {seed} {i} " + " ".join(rng.choices(WORDS, k=rng.randint(60, 160)))}
        rows.append(
            json.dumps({"custom_id": f"d{i}", "method": "POST", "url": "/v1/embeddings", "body": body})
        )
    return ("\n".join(rows) + "\n").encode()


class Job:
    """A batch job on the server: started, its completed lines read, cancelled."""

    def __init__(self, client: httpx.Client, lines: int, seed: int) -> None:
        up = client.post(
            "/v1/files", files={"file": ("j.jsonl", job_lines(lines, seed))}, data={"purpose": "batch"}
        )
        up.raise_for_status()
        body = {"input_file_id": up.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        self.client = client
        self.id = client.post("/v1/batches", json=body).json()["id"]
        while self.get()["status"] == "validating":
            time.sleep(0.1)
        assert self.get()["status"] == "in_progress", self.get()

    def get(self) -> dict[str, Any]:
        return dict(self.client.get(f"/v1/batches/{self.id}").json())

    def done(self) -> int:
        return int(self.get()["request_counts"]["completed"])

    def cancel(self) -> None:
        self.client.post(f"/v1/batches/{self.id}/cancel")
        while self.get()["status"] == "cancelling":
            time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--rate", type=float, default=20.0, help="online queries per second")
    p.add_argument("--seconds", type=float, default=20.0, help="per phase")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lines", type=int, default=5000, help="job lines (more than a phase answers)")
    p.add_argument("--port", type=int, default=8191)
    p.add_argument("--serve-args", default="", help="more `embedserve serve` options")
    p.add_argument("--src", default=None, help="serve from this source tree's src/ (an A/B run)")
    p.add_argument(
        "--settle", type=float, default=2.0, help="seconds of online load under the job reported apart"
    )
    a = p.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "embedserve", "serve", "--port", str(a.port), "--batch-dir", d]
        cmd += (["--model", a.model] if a.model else []) + shlex.split(a.serve_args)
        env = {**os.environ, **({"PYTHONPATH": str(Path(a.src) / "src")} if a.src else {})}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                deadline = time.monotonic() + 300
                while True:
                    try:
                        if client.get("/health/ready").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                    time.sleep(0.5)
                results: dict[str, list[float]] = {
                    k: [] for k in ("p50", "p99", "p50_job", "p99_job", "job", "both", "lull")
                }
                for r in range(a.rounds):
                    alone = [ms for _, ms in asyncio.run(online_load(base, a.rate, a.seconds, seed=2 * r))]
                    job = Job(client, a.lines, seed=r)
                    before, t0 = job.done(), time.monotonic()
                    time.sleep(a.seconds)
                    results["job"].append((job.done() - before) / (time.monotonic() - t0))
                    before, t0 = job.done(), time.monotonic()
                    timed = asyncio.run(online_load(base, a.rate, a.seconds + a.settle, seed=2 * r + 1))
                    mixed = [ms for at, ms in timed if at >= a.settle]
                    results["lull"].append(max([ms for at, ms in timed if at < a.settle], default=0.0))
                    results["both"].append((job.done() - before) / (time.monotonic() - t0))
                    job.cancel()
                    results["p50"].append(pct(alone, 0.5))
                    results["p99"].append(pct(alone, 0.99))
                    results["p50_job"].append(pct(mixed, 0.5))
                    results["p99_job"].append(pct(mixed, 0.99))
                    print(
                        f"round {r}: online alone p50 {pct(alone, 0.5):.1f} / p99 {pct(alone, 0.99):.1f} ms; "
                        f"under the job p50 {pct(mixed, 0.5):.1f} / p99 {pct(mixed, 0.99):.1f} ms; "
                        f"job {results['job'][-1]:.1f} lines/s alone, {results['both'][-1]:.1f} with online; "
                        f"first {a.settle:g} s after the lull: slowest {results['lull'][-1]:.0f} ms",
                        flush=True,
                    )
        finally:
            proc.terminate()
            proc.wait(60)
    m = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"\nmedians over {a.rounds} rounds ({a.rate:g} online queries/s, {a.seconds:g} s phases):\n"
        f"  online p50 {m['p50']:.1f} -> {m['p50_job']:.1f} ms ({m['p50_job'] / m['p50']:.2f}x), "
        f"p99 {m['p99']:.1f} -> {m['p99_job']:.1f} ms ({m['p99_job'] / m['p99']:.2f}x)\n"
        f"  job {m['job']:.1f} lines/s alone, {m['both']:.1f} with online ({m['both'] / m['job']:.2f}x)\n"
        f"  first {a.settle:g} s of online load after the job ran alone, slowest: {m['lull']:.0f} ms"
    )


if __name__ == "__main__":
    main()
