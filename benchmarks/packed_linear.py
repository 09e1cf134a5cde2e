"""oneDNN linear with the weight packed once (`Linear.prepack`) vs packed inside every call.

    .venv/bin/python benchmarks/packed_linear.py --model /tmp/embedserve-bench-models/q06

For each of the model's projection shapes and each row count: the median time of the plain
weight's call, and the packed weight's speed-up over it, best of three rounds, alternating.
Also checks the two give the same result (bf16: bit-identical; fp32 within 1e-5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from gflops import projection_shapes  # benchmarks/, first on the path when run as a script

from embedserve.models.linear import Linear


def _median_seconds(fn: torch.nn.Module, x: torch.Tensor, flops: float) -> float:
    ts = []
    for _ in range(max(3, min(200, int(2e9 / flops)))):
        t = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--rows", default="1,8,64,512,2048")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = projection_shapes(json.loads((args.model / "config.json").read_text()))
    rows = [int(r) for r in args.rows.split(",")]
    print(f"torch {torch.__version__}, {args.threads} threads\n")
    print("| dtype | projection | " + " | ".join(f"{r} rows" for r in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for proj, (k, n) in shapes.items():
            plain = Linear(k, n, bias=False).to(dtype)
            packed = Linear(k, n, bias=False).to(dtype)
            packed.weight = torch.nn.Parameter(plain.weight.detach().clone(), requires_grad=False)
            if not packed.prepack():
                raise SystemExit(f"oneDNN packing is not available for {name} here")
            cells = []
            for m in rows:
                x = torch.randn(m, k, dtype=dtype)
                with torch.inference_mode():
                    a, b = plain(x), packed(x)
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 0)
                    times: dict[str, list[float]] = {"plain": [], "packed": []}
                    for _ in range(3):
                        for label, fn in (("plain", plain), ("packed", packed)):
                            times[label].append(_median_seconds(fn, x, 2.0 * m * k * n))
                base = min(times["plain"])
                cells.append(f"{base * 1e3:.3f} ms, {base / min(times['packed']):.2f}x")
            print(f"| {name} | {proj} {k}x{n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
