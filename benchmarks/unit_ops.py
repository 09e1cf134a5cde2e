"""Where one layer-major unit's time goes, op by op: wall time and how many cores ran it.

    .venv/bin/python benchmarks/unit_ops.py --model /tmp/embedserve-bench-models/q06 \
        --dtype bfloat16 --rows 2048 --start 2048

Runs `DecoderModel.run_layer` (the lane's entry) on one unit of `--rows` rows at prompt
position `--start` (its K/V buffer holds `--start` earlier keys), the way the lane does, with
the model's own ops wrapped in timers: the projections, the norms, q/k norm + RoPE, attention
and the rotary tables. What the timers do not cover (the MLP's silu and product, the K/V
store, views, Python) is "the rest". Cores: the CPU time of all the process's threads
(`/proc/self/task/*/schedstat`) over the op's wall time; below the thread count means
threads waited inside the op (the kernel brings a running thread's CPU time up to date at its
scheduler tick, so the cores of ops under a few ms are noise; totals over a unit hold). The
native kernels are not ATen ops, so `torch.profiler` does not see them; this does.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from embedserve.engine.builder import build_engine
from embedserve.kernels import norm_rope
from embedserve.models import decoder_layer
from embedserve.models.decoder import DecoderModel
from embedserve.models.decoder_layer import DecoderLayer

Acc = dict[str, list[int]]  # name -> [wall ns, CPU ns]


def cpu_ns() -> int:
    """CPU time of every thread of this process so far, in ns."""
    total = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int(stat.read_text().split()[0])
    return total


def timed(acc: Acc, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter_ns(), cpu_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[name][0] += time.perf_counter_ns() - wall
            acc[name][1] += cpu_ns() - cpu

    return call


def instrument(model: DecoderModel, layer: DecoderLayer, acc: Acc) -> None:
    """Wrap the ops of `layer` (and the module functions it calls) in timers."""
    attn, mlp = layer.self_attn, layer.mlp
    for name, module in (
        ("input norm", layer.input_layernorm),
        ("qkv projection", attn.qkv_proj),
        ("output projection", attn.o_proj),
        ("gate/up projection, silu * up", mlp.gate_up_proj),
        ("down projection", mlp.down_proj),
    ):
        module.forward = timed(acc, name, module.forward)
    norm = layer.post_attention_layernorm
    norm.add_forward = timed(acc, "residual add + norm", norm.add_forward)
    if attn.q_norm is not None and attn.k_norm is not None:  # the PyTorch route's q/k norm
        attn.q_norm.forward = timed(acc, "q/k norm + RoPE", attn.q_norm.forward)
        attn.k_norm.forward = timed(acc, "q/k norm + RoPE", attn.k_norm.forward)
    decoder_layer.Rotary.apply = staticmethod(timed(acc, "q/k norm + RoPE", decoder_layer.Rotary.apply))
    norm_rope.qk_norm_rope = timed(acc, "q/k norm + RoPE", norm_rope.qk_norm_rope)
    decoder_layer.causal_attention = timed(acc, "attention", decoder_layer.causal_attention)
    model.rotary.cos_sin = timed(acc, "rotary tables", model.rotary.cos_sin)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=2048, help="rows of the unit")
    ap.add_argument("--start", type=int, default=2048, help="prompt position of its first row")
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    parts = build_engine(args.model, dtype=args.dtype, max_model_len=args.start + args.rows)
    model = cast(DecoderModel, parts.core.runner.model)
    cfg = model.config
    dtype = model.embed_tokens.weight.dtype
    acc: Acc = defaultdict(lambda: [0, 0])
    instrument(model, cast(DecoderLayer, model.layers[args.layer]), acc)
    gen = torch.Generator().manual_seed(0)
    end = args.start + args.rows
    kv = torch.randn(2, cfg.num_key_value_heads, end, cfg.head_dim, generator=gen).to(dtype)
    positions = torch.arange(args.start, end)
    unit = [0, 0]
    with torch.inference_mode():
        for i in range(2 + args.repeats):  # two warm-up units
            x = (0.5 * torch.randn(args.rows, cfg.hidden_size, generator=gen)).to(dtype)
            if i == 2:
                acc.clear()
                unit = [0, 0]
            wall, cpu = time.perf_counter_ns(), cpu_ns()
            model.run_layer(args.layer, x, positions, kv, args.start)
            unit[0] += time.perf_counter_ns() - wall
            unit[1] += cpu_ns() - cpu
    n = args.repeats
    rest = [unit[0] - sum(w for w, _ in acc.values()), unit[1] - sum(c for _, c in acc.values())]
    where = f"{args.rows} rows at position {args.start}, layer {args.layer}"
    print(f"{args.dtype}, {where}, {args.threads} threads:")
    print(f"  unit {unit[0] / n / 1e6:.1f} ms, {unit[1] / unit[0]:.2f} cores")
    print(f"  {'op':22s} {'ms':>8s} {'share':>6s} {'cores':>6s}")
    for name, (wall, cpu) in [*sorted(acc.items(), key=lambda kv: -kv[1][0]), ("the rest", rest)]:
        print(f"  {name:22s} {wall / n / 1e6:8.2f} {100 * wall / unit[0]:5.1f}% {cpu / max(wall, 1):6.2f}")


if __name__ == "__main__":
    main()
