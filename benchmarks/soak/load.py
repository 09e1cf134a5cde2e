"""Open-loop mixed-length load, a closed-loop calibration, and the process / queue monitor."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.soak.report import ProcSample, Sample
from tests.helpers.server_process import words

MIN_TOKENS, MAX_TOKENS = 16, 16384
QUEUE_GAUGES = (
    "embedserve_admitted_inputs",
    "embedserve_admitted_tokens",
    "embedserve_requests_waiting",
    "embedserve_requests_running",
)


@dataclass(frozen=True)
class Job:
    tokens: int  # exact, the end token included
    seed: int
    klass: str

    @property
    def text(self) -> str:
        return words(self.tokens - 1, self.seed)


def draw_job(rng: random.Random, seed: int) -> Job:
    """Log-uniform length in 16..16K tokens; short inputs mostly online, long ones batch."""
    tokens = round(math.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS))))
    online = rng.random() < (0.8 if tokens <= 1024 else 0.2)
    return Job(tokens, seed, "online" if online else "batch")


def mean_tokens() -> float:
    return (MAX_TOKENS - MIN_TOKENS) / math.log(MAX_TOKENS / MIN_TOKENS)


@dataclass
class Recorder:
    t0: float
    samples: list[Sample] = field(default_factory=list)
    # kept answers for the vector check: job -> served vector (every `keep_every`-th success per bucket)
    vectors: list[tuple[Job, np.ndarray]] = field(default_factory=list)
    keep_per_bucket: int = 12
    _kept: dict[int, int] = field(default_factory=dict)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def keep(self, job: Job, vector: list[float]) -> None:
        b = min(job.tokens.bit_length(), 15) // 2  # coarse length classes, so long ones are kept too
        if self._kept.get(b, 0) < self.keep_per_bucket:
            self._kept[b] = self._kept.get(b, 0) + 1
            self.vectors.append((job, np.asarray(vector, dtype=np.float32)))


async def send(client: httpx.AsyncClient, rec: Recorder, job: Job, phase: str, model: str) -> None:
    start = rec.now()
    body = {"input": job.text, "model": model, "priority": job.klass}
    try:
        r = await client.post("/v1/embeddings", json=body)
    except httpx.HTTPError as e:
        rec.samples.append(Sample(start, rec.now(), job.tokens, job.klass, phase, 0, False, type(e).__name__))
        return
    end, error = rec.now(), ""
    if r.status_code == 200:
        rec.keep(job, r.json()["data"][0]["embedding"])
    else:
        try:
            error = str(r.json()["error"]["message"])
        except Exception:  # uvicorn's own plain-text 503, a proxy page: keep its start
            error = "(no JSON error body) " + r.text
    retry = "retry-after" in r.headers
    rec.samples.append(Sample(start, end, job.tokens, job.klass, phase, r.status_code, retry, error[:120]))


async def open_loop(
    client: httpx.AsyncClient, rec: Recorder, rate: float, duration: float, seed: int, model: str,
    on_tick: Callable[[float], None] | None = None,
) -> None:  # fmt: skip
    """Poisson arrivals at `rate` requests/s for `duration` s, each request its own task."""
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    next_at, n = 0.0, 0
    while next_at < duration:
        delay = start + next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if on_tick is not None:
            on_tick(time.monotonic() - start)
        task = asyncio.create_task(send(client, rec, draw_job(rng, seed * 1_000_003 + n), "load", model))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
        next_at += rng.expovariate(rate)
    if tasks:
        await asyncio.gather(*list(tasks))


async def closed_loop(
    client: httpx.AsyncClient, rec: Recorder, clients: int, duration: float, seed: int, model: str, phase: str
) -> None:
    """`clients` clients, each sending its next request when the last one is answered."""
    rng = random.Random(seed)
    stop = time.monotonic() + duration
    counter = iter(range(1 << 30))

    async def one() -> None:
        while time.monotonic() < stop:
            await send(client, rec, draw_job(rng, seed * 1_000_003 + next(counter)), phase, model)

    await asyncio.gather(*(one() for _ in range(clients)))


def read_proc(t: float, name: str, pid: int) -> ProcSample | None:
    try:
        p = psutil.Process(pid)
        return ProcSample(t, name, p.memory_info().rss / 2**20, p.num_fds())
    except psutil.Error:  # a killed pool: no reading, not a zero
        return None


def queue_gauges(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in QUEUE_GAUGES:
            out[family.name.removeprefix("embedserve_")] = float(family.samples[0].value)
    return out


async def monitor(
    rec: Recorder, pids: Callable[[], dict[str, int]], out: list[ProcSample], stop: asyncio.Event
) -> None:
    """A reading of every server process each second until `stop`."""
    while not stop.is_set():
        for name, pid in pids().items():
            reading = read_proc(rec.now(), name, pid)
            if reading is not None:
                out.append(reading)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
