"""A short query's latency through the engine core on this thread (no HTTP, no loop thread),
and optionally a torch.profiler table of where its time goes.

    python benchmarks/short_query.py --model /tmp/embedserve-bench-models/q06 --dtype bfloat16 \
        --tokens 16 --queries 100 [--batch 8] [--profile 20] [--options '{"token_buckets": true}'] [--bound] \
        [--layer-by-layer]

Each query (or --batch of them together) is added as online requests and stepped to completion;
10 warm-up queries first.
Reported: p50 / p99 / min latency in ms and the CPU time per call (all threads).
--bound also measures, in the same process, this machine's read bandwidth (`torch.sum` over 1 GiB,
best of 5; the GiB on 2 MB pages like the engine's packed weights unless EMBEDSERVE_HUGE_PAGES=0)
and matmul peak in the query's dtype (benchmarks/gflops.py's, on the model's own projection
shapes), and prints the query's floor: max(projection weight bytes / bandwidth, projection
FLOPs / peak); then 20 rounds of (bandwidth, one query) paired, for the ratio of
the query to the streaming floor measured right before it (`paired`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gflops import matmul_peak, projection_shapes  # benchmarks/, first on the path when run as a script

from embedserve.engine.builder import build_engine
from embedserve.request import EmbedParams, Priority, Request
from embedserve.settings import settings
from embedserve.worker.host_memory import on_huge_pages


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--batch", type=int, default=1, help="queries added together (one step when they fit)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", type=int, default=0, help="profile this many more queries")
    p.add_argument("--bound", action="store_true", help="also measure this machine's floor")
    p.add_argument(
        "--layer-by-layer",
        action="store_true",
        help="run short steps layer by layer in Python, not in one native call (A/B of models/short_path.py)",
    )
    p.add_argument(
        "--options",
        default="{}",
        help='engine options as JSON, e.g. \'{"token_buckets": true, "compile_backend": "inductor"}\'',
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        start = time.perf_counter()
        parts = build_engine(args.model, dtype=args.dtype, **json.loads(args.options))
        core, cfg = parts.core, parts.config
        model = getattr(core.runner, "model", None)
        if args.layer_by_layer and model is not None:
            model.short_path = None
        print(f"short steps {'natively' if getattr(model, 'short_path', None) else 'layer by layer'}")
        ids = list(range(1000, 1000 + args.tokens))
        next_id = iter(range(1, 1 << 30))

        def one() -> None:
            params = EmbedParams(normalize=True)
            for _ in range(args.batch):
                core.add(Request(next(next_id), ids, params, cfg.pooling.method, Priority.ONLINE))
            while core.has_work:
                core.step()

        for _ in range(10):
            one()
        print(f"built and warmed up in {time.perf_counter() - start:.1f} s")
        lat, cpu = [], time.process_time()
        for _ in range(args.queries):
            t = time.perf_counter()
            one()
            lat.append((time.perf_counter() - t) * 1000)
        cpu = (time.process_time() - cpu) * 1000 / args.queries
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"{args.dtype} {args.batch} x {args.tokens} tokens: p50 {lat[len(lat) // 2]:.1f} ms, "
            f"p99 {p99:.1f} ms, min {lat[0]:.1f} ms, {cpu:.1f} CPU-ms per call"
        )
        if args.bound:
            hf = json.loads((Path(args.model) / "config.json").read_text())
            print(floor_ms(hf, cfg.dtype, args.tokens))
            print(paired(one, hf, cfg.dtype))
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.profile):
                    one()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def gib() -> torch.Tensor:
    """1 GiB of fp32 ones to stream, on the page size the engine's weights are on: a floor read
    from 4 KB pages would be lower than what the weights' own pages allow."""
    big = torch.ones(1 << 28)
    if settings().huge_pages:
        on_huge_pages(big.data_ptr(), big.numel() * 4)
    return big


def read_bandwidth() -> float:
    """GB/s of `torch.sum` over 1 GiB of fp32, best of 5."""
    big = gib()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - t)
    return big.numel() * 4 / best / 1e9


def paired(one: Callable[[], None], cfg: dict[str, int], dtype: torch.dtype, rounds: int = 20) -> str:
    """The query against the streaming floor measured right before it, round by round: this
    box's bandwidth drifts by a quarter within minutes (other tenants), so a floor measured
    once, before or after, can flatter or wrong the query. Per round: the best of two
    `torch.sum` over 1 GiB, then one query."""
    weights = cfg["num_hidden_layers"] * sum(k * n for k, n in projection_shapes(cfg).values())
    big, ratios, rates = gib(), [], []
    for _ in range(rounds):
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            big.sum()
            best = min(best, time.perf_counter() - t)
        rates.append(big.numel() * 4 / best / 1e9)
        t = time.perf_counter()
        one()
        ratios.append((time.perf_counter() - t) / (weights * dtype.itemsize / rates[-1] / 1e9))
    ratios.sort()
    return (
        f"paired ({rounds} rounds): query / streaming floor median {ratios[rounds // 2]:.2f}x "
        f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x), bandwidth {min(rates):.1f}-{max(rates):.1f} GB/s"
    )


def floor_ms(cfg: dict[str, int], dtype: torch.dtype, tokens: int) -> str:
    """The query's floor on this machine, measured now (see the module doc)."""
    bandwidth, peak = read_bandwidth(), matmul_peak(cfg, dtype)
    weights = cfg["num_hidden_layers"] * sum(k * n for k, n in projection_shapes(cfg).values())
    stream = weights * dtype.itemsize / bandwidth / 1e6
    compute = 2 * weights * tokens / peak / 1e6
    return (
        f"read bandwidth {bandwidth:.1f} GB/s, matmul peak {peak:.0f} GFLOP/s; {weights / 1e6:.0f} M "
        f"projection weights: streaming {stream:.1f} ms, compute {compute:.1f} ms, "
        f"floor {max(stream, compute):.1f} ms"
    )


if __name__ == "__main__":
    main()
