"""Engine vs Hugging Face transformers on the same random-weight Qwen3 model, side by side.

Prints (1) the minimum cosine to the fp32 transformers reference per length bucket for the
engine in fp32 and bf16, with a token budget that forces chunking, and (2) tokens/s of the
engine and of the transformers forward (one sequence at a time, no padding) on the same inputs.

    python benchmarks/engine_vs_hf.py --hidden 64 --layers 2          # the CI fixture shape
    python benchmarks/engine_vs_hf.py --hidden 512 --layers 8 --heads 8 --kv-heads 4
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embedserve import Engine
from tests.helpers.reference import cosine, hf_embed_ids, random_ids
from tests.helpers.tiny_models import build_decoder

BUCKETS = [("1-1K", 1, 1024), ("1K-4K", 1025, 4096), ("4K-16K", 4097, 16384)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lengths", default="1,37,500,1000,1500,3000,4096,6000,12000,16000")
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--speed-lengths", default="512,2048,8192")
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_decoder(
            Path(tmp) / "m",
            "qwen3",
            hidden=args.hidden,
            layers=args.layers,
            heads=args.heads,
            kv_heads=args.kv_heads,
        )
        lengths = [int(x) for x in args.lengths.split(",")]
        seqs = [random_ids(n, seed=n) for n in lengths]
        ref = hf_embed_ids(path, seqs)
        shape = f"hidden {args.hidden} x {args.layers} layers"
        print(f"\nparity vs transformers fp32, budget {args.budget} (chunked), {shape}")
        print("| dtype | " + " | ".join(b[0] for b in BUCKETS) + " |\n|---|" + "---|" * len(BUCKETS))
        for dtype in ("float32", "bfloat16"):
            with Engine.from_pretrained(
                path, dtype=dtype, max_num_batched_tokens=args.budget, max_model_len=16384
            ) as engine:
                cos = cosine(engine.embed(seqs), ref)
            cells = [
                f"{min(c for n, c in zip(lengths, cos, strict=True) if lo <= n <= hi):.7f}"
                for _, lo, hi in BUCKETS
            ]
            print(f"| {dtype} | " + " | ".join(cells) + " |")
        print("\nthroughput, one sequence per call, fp32 (tokens/s)")
        print("| tokens | transformers | engine (budget 2048) | ratio |\n|---|---|---|---|")
        with Engine.from_pretrained(path, max_num_batched_tokens=2048, max_model_len=16384) as engine:
            for n in (int(x) for x in args.speed_lengths.split(",")):
                ids = [random_ids(n, seed=99)]
                hf_embed_ids(path, ids)  # warm
                engine.embed(ids)
                t0 = time.perf_counter()
                hf_embed_ids(path, ids)
                t_hf = time.perf_counter() - t0
                t0 = time.perf_counter()
                engine.embed(ids)
                t_en = time.perf_counter() - t0
                print(f"| {n} | {n / t_hf:,.0f} | {n / t_en:,.0f} | {t_hf / t_en:.2f}x |")


if __name__ == "__main__":
    np.set_printoptions(precision=7)
    main()
