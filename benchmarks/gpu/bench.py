"""GPU benchmark (issue #10): parity, then throughput of embedserve vs transformers, per shape.

    bash benchmarks/gpu/run.sh              # on the device (H200): well under 10 minutes
    python benchmarks/gpu/bench.py --cpu-smoke   # the same flow on CPU with tiny shapes

Per shape (Qwen3-Embedding-8B, then 0.6B), each phase under its own time budget; a phase
that would overrun the run's deadline is skipped with a note, and a failing phase is
recorded and the run goes on:

  1. fp32 transformers reference vectors at 1K / 4K / 16K tokens (random-weight model)
  2. bf16 engine (chunked at max_num_batched_tokens 8192): parity, cosine >= 0.999
  3. engine throughput at 16K and 4K tokens: requests all in flight at once
  4. transformers bf16 + SDPA throughput on the same inputs, batched by token count
The summary table is printed last; JSON and the table go to --out ($OUT on the device).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # models, phases, report, engine_setup
sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "src"))  # embedserve without install

import phases
from engine_setup import CountingRoute, counting_route, device_facts, make_engine
from models import SHAPES, Shape, build_hf_model
from report import Record, summary, write

PARITY_BAR = 0.999
# Share of the run's budget per phase (first shape, then the others). A phase's budget sizes
# its request count and gates skipping; reference, parity and builds use far less than theirs.
SHARES: list[dict[str, Any]] = [
    {"reference": 0.05, "build": 0.02, "parity": 0.03, "engine": (0.30, 0.08), "hf": (0.11, 0.05)},
    {"reference": 0.02, "build": 0.02, "parity": 0.02, "engine": (0.05, 0.03), "hf": (0.04, 0.02)},
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU: checks the whole flow")
    p.add_argument("--shapes", default="qwen3-8b,qwen3-0.6b", help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--parity-lengths", default="1024,4096,16384")
    p.add_argument("--lengths", default="16384,4096", help="throughput input lengths (tokens)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument(
        "--max-requests",
        type=int,
        default=256,
        help="cap at the longest length; shorter lengths get the same token count",
    )
    p.add_argument("--hf-batch-tokens", type=int, default=65536, help="transformers batch = this // length")
    p.add_argument("--budget-s", type=float, default=450.0, help="whole run, start-up included")
    p.add_argument("--attention", default="auto", choices=["auto", "cpu", "sdpa-lower-right"])
    p.add_argument("--buckets", action="store_true", help="pad steps to token buckets (off: unmeasured)")
    p.add_argument("--compile", default=None, help="torch.compile backend for the bucketed runner")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet dense bf16 peak")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/gpu/out")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.shapes, args.parity_lengths, args.lengths = "tiny,tiny2", "64,256,1024", "512,128"
        args.max_num_batched_tokens, args.max_requests, args.hf_batch_tokens = 256, 4, 1024
        args.budget_s = min(args.budget_s, 90.0)
    return args


class Run:
    """One benchmark run: the record, the deadline, and the phases per shape."""

    def __init__(
        self, args: argparse.Namespace, rec: Record, headline: tuple[str, int], route: CountingRoute
    ) -> None:
        self.args, self.rec, self.headline, self.route = args, rec, headline, route
        self.deadline = time.monotonic() + args.budget_s
        self.dev = torch.device("cpu" if args.cpu_smoke else "cuda")
        self.lengths = [int(x) for x in args.lengths.split(",")]
        self.parity_lengths = [int(x) for x in args.parity_lengths.split(",")]
        # Same token count per throughput phase whatever the input length.
        self.caps = {n: args.max_requests * max(self.lengths) // n for n in self.lengths}
        self.peaks = {"datasheet": args.peak_tflops, "measured": rec.meta.get("matmul_tflops")}

    def phase(self, name: str, share: float, fn: Callable[[float], Any]) -> Any:
        """`fn(budget_s)` unless the deadline is too close; errors are recorded, the run goes on."""
        budget = share * self.args.budget_s
        left = self.deadline - time.monotonic()
        allowed = min(budget, left - 10.0)
        if allowed < 0.3 * budget:
            self.rec.skip(name, f"{left:.0f} s left of the run budget, phase needs ~{budget:.0f} s")
            return None
        t = time.perf_counter()
        print(f"[phase] {name} (budget {allowed:.0f} s)", flush=True)
        try:
            result = fn(allowed)
        except Exception as e:  # OOM, kernel refusal, ...: note it, free memory, go on
            self.rec.error(name, e)
            result = None
        phases.free(self.dev)
        print(f"[done] {name} in {time.perf_counter() - t:.1f} s", flush=True)
        write(self.rec, Path(self.args.out), self.headline)  # partial results survive a kill
        return result

    def shape(self, shape: Shape, shares: dict[str, Any]) -> None:
        seed, dev = self.args.seed, self.dev
        inputs = [phases.random_inputs(1, n, shape.vocab, seed + n)[0] for n in self.parity_lengths]
        ref = self.phase(
            f"{shape.name} fp32 reference",
            shares["reference"],
            lambda _: phases.reference_vectors(shape, seed, dev, inputs),
        )
        firsts = self.engine_phases(shape, shares, inputs, ref)
        phases.free(dev)  # the engine and its KV pool are unreferenced now: give the memory back
        self.hf_phases(shape, shares, firsts)

    def engine_phases(
        self, shape: Shape, shares: dict[str, Any], inputs: list[list[int]], ref: dict[str, Any] | None
    ) -> dict[int, np.ndarray]:
        """Parity and throughput on one engine; it (and its KV cache) is gone when this returns."""
        max_len = max(self.parity_lengths + self.lengths)
        engine = self.phase(
            f"{shape.name} engine build",
            shares["build"],
            lambda _: make_engine(self.args, shape, self.dev, max_len, self.route),
        )
        firsts: dict[int, np.ndarray] = {}
        if engine is None:
            return firsts
        with engine:
            if ref is not None:
                check = partial(phases.engine_parity, engine, inputs, ref["vectors"], PARITY_BAR)
                out = self.phase(f"{shape.name} parity", shares["parity"], lambda _: check())
                if out is not None:
                    self.rec.parity.append({"shape": shape.name, "reference_wall_s": ref["wall_s"], **out})
            for n, share in zip(self.lengths, shares["engine"], strict=False):
                fn = partial(
                    phases.engine_throughput,
                    engine,
                    shape,
                    n,
                    self.caps[n],
                    seed=self.args.seed,
                    device=self.dev,
                )
                res = self.phase(f"{shape.name} engine {n}", share, fn)
                if res is not None:
                    firsts[n] = res["first_vectors"]
                    self.rec.row(shape.name, n, res, shape.flops_per_token(n), self.peaks)
        return firsts

    def hf_phases(self, shape: Shape, shares: dict[str, Any], firsts: dict[int, np.ndarray]) -> None:
        seed, dev = self.args.seed, self.dev
        hf = self.phase(
            f"{shape.name} transformers build",
            shares["build"],
            lambda _: build_hf_model(shape, seed, dev, torch.bfloat16),
        )
        if hf is None:
            return
        for n, share in zip(self.lengths, shares["hf"], strict=False):
            batch = max(1, self.args.hf_batch_tokens // n)
            fn = partial(phases.hf_throughput, hf, shape, n, self.caps[n], batch, seed=seed, device=dev)
            res = self.phase(f"{shape.name} transformers {n}", share, fn)
            if res is not None:
                if n in firsts:  # same seed -> the same first inputs on both backends
                    k = min(len(firsts[n]), len(res["first_vectors"]))
                    res["cosine_vs_engine"] = float(
                        np.sum(firsts[n][:k] * res["first_vectors"][:k], -1).min()
                    )
                self.rec.row(shape.name, n, res, shape.flops_per_token(n), self.peaks)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rec = Record()
    logging.basicConfig(format="[%(name)s] %(message)s")
    logging.getLogger("embedserve.attention.select").setLevel(logging.INFO)  # which kernel, why
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device visible (use --cpu-smoke to check the flow on CPU)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must stay fp32
    rec.meta = {"args": vars(args), "device": device_facts(dev)}
    route = counting_route(args.attention, dev)
    rec.meta["attention"] = route.route.name
    if dev.type == "cuda":
        rec.meta["matmul_tflops"] = phases.matmul_tflops(dev)
        print(f"[info] bf16 matmul 8192^3: {rec.meta['matmul_tflops']:.0f} TFLOP/s", flush=True)
    shapes = [SHAPES[s] for s in args.shapes.split(",")]
    run = Run(args, rec, (shapes[0].name, max(int(x) for x in args.lengths.split(","))), route)
    for i, shape in enumerate(shapes):
        run.shape(shape, SHARES[min(i, 1)])
    rec.meta["attention_calls"] = route.calls  # 0 would mean the engine never ran this route
    table = summary(rec, run.headline)
    path = write(rec, Path(args.out), run.headline, table)
    print(table, flush=True)
    print(f"JSON: {path}", flush=True)
    parity_failed = any(not p["passed"] for p in rec.parity)
    return 1 if rec.errors or parity_failed else 0


if __name__ == "__main__":
    sys.exit(main())
