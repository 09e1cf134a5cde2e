"""A/B two source trees (or two engine configurations) of embedserve on one model, side by side.

Each round runs tree A, then tree B, each in a fresh process (so neither warms the other's
caches), alternating for `--rounds`; every process embeds each workload once after a warm-up
and reports wall time, CPU time (all its threads) and the vectors. The report gives, per
workload, the median tokens/s and tokens per CPU-second of each tree, B/A ratios, and the
largest difference between the two trees' vectors (a refactor must not move them).

    python benchmarks/ab_source.py --a /tmp/before/src --b src --model DIR \
        --workloads 512x8,4096,16384 --dtype float32 --rounds 2

A workload is LENGTH or LENGTHxCOUNT (COUNT inputs of LENGTH random token ids, one call), or
`mix` (24 inputs, lengths log-uniform in 16..8K). `--options-a` / `--options-b` give each side
engine options as JSON, e.g. the cost of deterministic mode on one tree:

    python benchmarks/ab_source.py --a src --b src --options-b '{"deterministic": true}' ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

# Runs inside the measured process, with the tree's `src` first on sys.path.
_CHILD = r"""
import json, sys, time
import numpy as np
from embedserve import Engine

model, dtype, workloads, budget = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
options, top = json.loads(sys.argv[5]), int(sys.argv[6])
rng = np.random.default_rng(0)
out = {}
with Engine.from_pretrained(model, dtype=dtype, max_num_batched_tokens=budget, **options) as engine:
    engine.embed([rng.integers(1000, top, 64).tolist()])  # warm-up: kernels built, pages touched
    for name, (length, count) in workloads.items():
        if length == 0:  # the mix: log-uniform lengths in 16..8K
            sizes = np.exp(np.random.default_rng(1).uniform(np.log(16), np.log(8192), count)).astype(int)
        else:
            sizes = [length] * count
        ids = [rng.integers(1000, top, int(n)).tolist() for n in sizes]
        wall, cpu = time.perf_counter(), time.process_time()
        vectors = engine.embed(ids)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        tokens = int(sum(len(x) for x in ids))
        out[name] = {"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "vectors": vectors.tolist()}
print("RESULT " + json.dumps(out))
"""


def parse_workloads(spec: str) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for item in spec.split(","):
        if item.strip() == "mix":
            found["mix"] = (0, 24)
            continue
        length, _, count = item.strip().partition("x")
        try:
            n, c = int(length), int(count or 1)
        except ValueError:
            raise SystemExit(f"bad workload {item!r}: expected LENGTH or LENGTHxCOUNT") from None
        if n < 1 or c < 1:
            raise SystemExit(f"bad workload {item!r}: length and count must be >= 1")
        found[item.strip()] = (n, c)
    return found


def run_tree(
    src: Path, options: str, args: argparse.Namespace, workloads: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src), TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable,
        "-c",
        _CHILD,
        args.model,
        args.dtype,
        json.dumps(workloads),
        str(args.budget),
        options,
        str(args.max_id or max_token_id(args.model)),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"tree {src} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def max_token_id(model: str) -> int:
    """50,000, or the model's vocabulary where smaller (SmolLM2: 49,152)."""
    config = Path(model) / "config.json"
    vocab = json.loads(config.read_text()).get("vocab_size", 50000) if config.is_file() else 50000
    return min(50000, int(vocab))


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for va, vb in zip(a, b, strict=True) for x, y in zip(va, vb, strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", type=Path, required=True, help="source dir of tree A (the baseline)")
    p.add_argument("--b", type=Path, required=True, help="source dir of tree B (the change)")
    p.add_argument("--model", required=True)
    p.add_argument("--workloads", default="512x8,4096,16384")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--max-id",
        type=int,
        default=None,
        help="token ids drawn from 1000 .. this (exclusive); default 50,000 or the model's vocabulary",
    )
    p.add_argument("--options-a", default="{}", help="engine options of side A, JSON")
    p.add_argument("--options-b", default="{}", help="engine options of side B, JSON")
    args = p.parse_args(argv)
    for tree in (args.a, args.b):
        if not (tree / "embedserve" / "__init__.py").is_file():
            raise SystemExit(f"{tree} is not a source dir holding the embedserve package")
    workloads = parse_workloads(args.workloads)
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for label, tree, options in (("A", args.a, args.options_a), ("B", args.b, args.options_b)):
            runs[label].append(run_tree(tree.resolve(), options, args, workloads))
            print(f"round {r + 1}/{args.rounds}: {label} done", file=sys.stderr, flush=True)
    print(
        f"A = {args.a} {args.options_a}, B = {args.b} {args.options_b}, model {args.model}, "
        f"{args.dtype}, budget {args.budget}, {args.rounds} rounds alternating A, B (medians)"
    )
    print("| workload | A tok/s | B tok/s | B/A | A tok/CPU-s | B tok/CPU-s | B/A | max abs vector diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name in workloads:
        a = [run[name] for run in runs["A"]]
        b = [run[name] for run in runs["B"]]
        tok = a[0]["tokens"]
        a_tps, b_tps = (statistics.median(tok / x["wall_s"] for x in side) for side in (a, b))
        a_cpu, b_cpu = (statistics.median(tok / x["cpu_s"] for x in side) for side in (a, b))
        diff = max(max_abs_diff(x["vectors"], y["vectors"]) for x, y in zip(a, b, strict=True))
        print(
            f"| {name} | {a_tps:.1f} | {b_tps:.1f} | {b_tps / a_tps:.3f} | {a_cpu:.1f} | {b_cpu:.1f} | "
            f"{b_cpu / a_cpu:.3f} | {diff:.2e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
