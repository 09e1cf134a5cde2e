"""A short query's latency through the engine core on this thread (no HTTP, no loop thread),
and optionally a torch.profiler table of where its time goes.

    python benchmarks/short_query.py --model /tmp/embedserve-bench-models/q06 --dtype bfloat16 \
        --tokens 16 --queries 100 [--profile 20] [--options '{"token_buckets": true}']

Each query is added as an online request and stepped to completion; 10 warm-up queries first.
Reported: p50 / p99 / min latency in ms and the CPU time per query (all threads).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from embedserve.engine.builder import build_engine
from embedserve.request import EmbedParams, Priority, Request


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", type=int, default=0, help="profile this many more queries")
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
        ids = list(range(1000, 1000 + args.tokens))
        next_id = iter(range(1, 1 << 30))

        def one() -> None:
            params = EmbedParams(normalize=True)
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
            f"{args.dtype} {args.tokens} tokens: p50 {lat[len(lat) // 2]:.1f} ms, p99 {p99:.1f} ms, "
            f"min {lat[0]:.1f} ms, {cpu:.1f} CPU-ms per query"
        )
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.profile):
                    one()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
