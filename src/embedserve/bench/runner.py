"""The matrix runner: plan (target x token budget) groups, run each in a worker, collect cells.

    target ──┬── token budget 512 ──> worker process: open engine, warm up, cosine sample,
             │                          cells (workload x concurrency), interference
             └── token budget 1024 ─> worker process ...
    st/http ──── n/a ───────────────> worker process ...

A worker that fails to open its target, dies (e.g. killed for memory) or stalls past
`cell_timeout` has every unfinished cell recorded as an error; the run goes on. Before each
group the runner waits (10 s at most) until the served targets' processes (`pid=`) are quiet:
a peer's threads that keep spinning after its own cells would slow the next target's.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from embedserve.bench.config import BenchConfig
from embedserve.bench.cputime import wait_quiet
from embedserve.bench.images import ImageMix, with_images
from embedserve.bench.inputs import MIX, TextMaker, Workload, draw_mix_lengths
from embedserve.bench.stats import Sample, samples_from_json
from embedserve.bench.target import TargetSpec
from embedserve.bench.worker import PREFIX
from embedserve.errors import InvalidInputError

SHORT, FLOOD = "short", "flood"
_WARMUP_TOKENS = 16
QUIET_WAIT_S = 10.0  # at most, before each target's cells, for served targets (`pid=`) to go quiet


@dataclass(frozen=True)
class Cell:
    id: int
    workload: str
    concurrency: int
    requests: int


@dataclass
class CellResult:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    peak_mem: int | None = None
    start_mem: int | None = None  # the same measure as the cell began (see bench/memory.py)
    cpu_s: float | None = None  # CPU seconds the target used during the cell
    counters: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # why the cell did not run at all
    oom: bool = False


@dataclass
class Group:
    """One worker: one target at one token budget (None where the axis does not apply)."""

    target: int
    spec: TargetSpec
    token_budget: int | None
    cells: list[Cell]
    results: dict[int, CellResult] = field(default_factory=dict)
    device: str = ""
    mem_method: str = "n/a"
    threads: int | None = None
    load_s: float | None = None
    vectors: dict[str, list[Any]] = field(default_factory=dict)
    interference: dict[str, Any] | None = None
    error: str | None = None
    oom: bool = False


def build_inputs(cfg: BenchConfig) -> dict[str, Workload]:
    maker = TextMaker(cfg.tokenizer_file(), cfg.text, cfg.data_dir)
    rng = np.random.default_rng(cfg.seed)
    warm = max(_WARMUP_TOKENS, maker.num_special + 1)
    out: dict[str, Workload] = {"warmup": maker.workload("warmup", [warm], cfg.seed)}
    if cfg.scenario == "interference":
        n_docs = max(8, 2 * cfg.flood_clients)
        doc_lengths = [
            round(float(np.exp(rng.uniform(np.log(cfg.flood_min), np.log(cfg.flood_max)))))
            for _ in range(n_docs)
        ]
        out[SHORT] = maker.workload(SHORT, [cfg.short_tokens] * cfg.short_requests, cfg.seed)
        out[FLOOD] = maker.workload(FLOOD, doc_lengths, cfg.seed)
        return out
    mix = cfg.image_mix()
    for n in cfg.lengths:
        out[str(n)] = _workload(maker, str(n), [n] * cfg.requests, cfg.seed, mix)
    if cfg.mix:
        shortest = max(cfg.min_tokens, mix.tokens + maker.num_special + 1) if mix else cfg.min_tokens
        lengths = draw_mix_lengths(cfg.mix, cfg.requests, rng, shortest, cfg.max_tokens)
        out[MIX] = _workload(maker, MIX, lengths, cfg.seed, mix)
    return out


def _workload(maker: TextMaker, key: str, lengths: list[int], seed: int, mix: ImageMix | None) -> Workload:
    """Requests of these total lengths: texts, or with an image mix, shorter texts + images."""
    if mix is None:
        return maker.workload(key, lengths, seed)
    room = min(lengths) - mix.tokens
    if room <= maker.num_special:
        raise InvalidInputError(
            f"a {min(lengths)}-token input leaves no room for text beside {mix.describe()}: "
            f"use lengths above {mix.tokens + maker.num_special}"
        )
    texts = maker.workload(key, [n - mix.tokens for n in lengths], seed).texts
    return Workload(key, with_images([str(t) for t in texts], mix, key, seed), list(lengths))


def plan(cfg: BenchConfig) -> list[Group]:
    groups, next_id = [], 0
    workloads = [*map(str, cfg.lengths), *([MIX] if cfg.mix else [])]
    for t, spec in enumerate(cfg.targets):
        for budget in cfg.token_budgets if spec.has_budget_axis else [None]:
            cells = []
            if cfg.scenario == "matrix":
                for w in workloads:
                    for c in cfg.concurrency:
                        cells.append(Cell(next_id, w, c, cfg.requests))
                        next_id += 1
            groups.append(Group(t, spec, budget, cells))
    return groups


def _job(cfg: BenchConfig, group: Group, inputs_path: Path, warmup: str) -> dict[str, Any]:
    job: dict[str, Any] = {
        "target": group.spec.raw,
        "token_budget": group.token_budget,
        "inputs": str(inputs_path),
        "warmup": warmup,
        "cells": [c.__dict__ for c in group.cells],
        "cosine_sample": cfg.cosine_sample if cfg.scenario == "matrix" else 0,
        "threads": cfg.threads,
    }
    if cfg.scenario == "interference":
        job["interference"] = {
            "short_key": SHORT,
            "flood_key": FLOOD,
            "interval_s": cfg.short_interval_ms / 1000,
            "flood_clients": cfg.flood_clients,
            "settle_s": cfg.settle_s,
        }
    return job


def _reader(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        if line.startswith(PREFIX):
            lines.put(line[len(PREFIX) :])
    lines.put(None)


def _handle(group: Group, msg: dict[str, Any]) -> bool:
    """Apply one worker message; True when it finished a cell (or the whole group failed)."""
    kind = msg["type"]
    if kind == "opened":
        group.load_s, group.device, group.mem_method = msg["load_s"], msg["device"], msg["mem_method"]
        group.threads = msg["threads"]
    elif kind == "open_failed":
        group.error, group.oom = msg["error"], bool(msg["oom"])
        return True
    elif kind == "vectors":
        group.vectors[msg["key"]] = msg["vectors"]
    elif kind == "cell":
        group.results[msg["id"]] = CellResult(
            samples_from_json(msg["samples"]),
            msg["wall_s"],
            msg["peak_mem"],
            msg.get("start_mem"),
            msg["cpu_s"],
            msg["counters"],
        )
        return True
    elif kind == "interference":
        group.interference = msg
        return True
    return False


def run_group(cfg: BenchConfig, group: Group, workdir: Path, warmup: str, tick: Callable[[], object]) -> None:
    job_path = workdir / f"job-{group.target}-{group.token_budget}.json"
    job_path.write_text(json.dumps(_job(cfg, group, workdir / "inputs.json", warmup)))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "embedserve.bench.worker", str(job_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        timed_out = False
        while True:
            try:
                line = lines.get(timeout=cfg.cell_timeout)
            except queue.Empty:
                timed_out = True
                proc.kill()
                break
            if line is None:
                break
            if _handle(group, json.loads(line)):
                tick()
        code = proc.wait()
        err.seek(0)
        tail = " | ".join(err.read().strip().splitlines()[-3:])[-400:]
    _record_failure(group, code, timed_out, tail, cfg.cell_timeout)


def _record_failure(group: Group, code: int, timed_out: bool, tail: str, timeout: float) -> None:
    """Every cell the worker did not report gets the reason, so the report shows it."""
    if group.error is None:
        if timed_out:
            group.error = f"no progress for {timeout:.0f} s: worker killed"
        elif code != 0:
            # -9 without a Python traceback is what the kernel's OOM killer leaves behind.
            group.oom = code == -9
            group.error = f"worker exited with code {code}" + (f": {tail}" if tail else "")
        else:
            return
    for c in group.cells:
        if c.id not in group.results:
            group.results[c.id] = CellResult(error=group.error, oom=group.oom)


def run(cfg: BenchConfig) -> tuple[list[Group], dict[str, Workload]]:
    from tqdm import tqdm

    inputs = build_inputs(cfg)
    groups = plan(cfg)
    total = sum(max(len(g.cells), 1) for g in groups)
    with (
        tempfile.TemporaryDirectory(prefix="embedserve-bench-") as tmp,
        tqdm(total=total, desc="bench", unit="cell", disable=not cfg.progress) as bar,
    ):
        workdir = Path(tmp)
        (workdir / "inputs.json").write_text(
            json.dumps({k: {"texts": w.texts, "tokens": w.tokens} for k, w in inputs.items()})
        )
        served = sorted({int(g.spec.options["pid"]) for g in groups if "pid" in g.spec.options})
        for g in groups:
            bar.set_postfix_str(f"{g.spec.name} budget={g.token_budget or 'n/a'}")
            wait_quiet(served, QUIET_WAIT_S)  # a served peer's spinning threads after its own cells
            before = bar.n
            run_group(cfg, g, workdir, str(inputs["warmup"].texts[0]), lambda: bar.update(1))
            bar.update(max(len(g.cells), 1) - (bar.n - before))  # failed cells count as done too
    return groups, inputs
