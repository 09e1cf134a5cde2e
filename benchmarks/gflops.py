"""Achieved GFLOP/s of the engine vs this machine's measured matmul peak (issue #8, target 6).

    .venv/bin/python benchmarks/gflops.py --model /tmp/embedserve-bench-models/q06 --length 4096

Peak: the best of torch's `F.linear` (MKL sgemm for fp32, oneDNN for bf16) and the engine's
`Linear` (oneDNN for fp32 too, with the weight packed as the engine packs it) on the model's own
projection shapes at 2,048 rows, best of three.
Engine: one input of --length tokens, timed after a warm-up,
counting 2 FLOPs per weight per token for every projection plus causal attention
(QK^T and PV: 4 * heads * head_dim FLOPs per visible key, (L+1)/2 keys per token on average).
The LM head and the embedding lookup are not FLOPs (pooling reads hidden states).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from embedserve import Engine
from embedserve.models.linear import Linear


def model_flops_per_token(cfg: dict[str, int], length: int) -> float:
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    weights = (
        hidden * (heads + 2 * kv_heads) * head_dim  # q, k, v
        + heads * head_dim * hidden  # o
        + 3 * hidden * cfg["intermediate_size"]  # gate, up, down
    )
    attention = 4 * heads * head_dim * (length + 1) / 2
    return float(cfg["num_hidden_layers"] * (2 * weights + attention))


def projection_shapes(cfg: dict[str, int]) -> dict[str, tuple[int, int]]:
    """The decoder's projections as (in, out) features, fused as the engine runs them."""
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    return {
        "qkv": (hidden, (heads + 2 * kv_heads) * head_dim),
        "o": (heads * head_dim, hidden),
        "gate_up": (hidden, 2 * cfg["intermediate_size"]),
        "down": (cfg["intermediate_size"], hidden),
    }


def matmul_peak(cfg: dict[str, int], dtype: torch.dtype, rows: int = 2048) -> float:
    best = 0.0
    for k, n in projection_shapes(cfg).values():
        x = torch.randn(rows, k, dtype=dtype)
        layer = Linear(k, n, bias=False).to(dtype)
        weight = layer.weight.detach().clone()
        layer.prepack()
        for fn in (layer, lambda x, w=weight: torch.nn.functional.linear(x, w)):
            fn(x)
            for _ in range(3):
                t = time.perf_counter()
                for _ in range(3):
                    fn(x)
                best = max(best, 3 * 2 * rows * k * n / (time.perf_counter() - t) / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budget", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = json.loads((args.model / "config.json").read_text())
    flops = model_flops_per_token(cfg, args.length) * args.length
    top = min(100_000, int(cfg["vocab_size"]))  # ids the model's vocabulary has (SmolLM2: 49,152)
    ids = torch.randint(1000, top, (args.length,), generator=torch.Generator().manual_seed(0)).tolist()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {args.threads} threads, torch {torch.__version__}")
    print(
        f"model: {args.model.name}, {args.length} tokens = {flops / 1e12:.2f} TFLOP "
        f"({flops / args.length / 1e9:.2f} GFLOP per token)\n"
    )
    print("| dtype | matmul peak GFLOP/s | engine tok/s | engine GFLOP/s | of peak |")
    print("|---|---|---|---|---|")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        peak = matmul_peak(cfg, dtype)
        with Engine.from_pretrained(
            args.model, dtype=name, max_num_batched_tokens=args.budget, max_model_len=args.length
        ) as engine:
            engine.embed([ids[:64]])
            t = time.perf_counter()
            engine.embed([ids])
            dt = time.perf_counter() - t
        achieved = flops / dt / 1e9
        print(f"| {name} | {peak:,.0f} | {args.length / dt:,.1f} | {achieved:,.0f} | {achieved / peak:.0%} |")


if __name__ == "__main__":
    main()
