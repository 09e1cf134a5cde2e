"""The fp32 short-rows kernel alone, one or more of its sources side by side, over a model's
projection shapes with every layer's weights read from memory, as a short query reads them.

    python benchmarks/short_rows_ab.py --model /tmp/embedserve-bench-models/q06 \
        [--rows 16] [--rounds 15] [--threads 2] [--same-layer] [A.cpp B.cpp ...]

Each source (default: the package's `kernels/short_linear_f32.cpp`; a copy elsewhere needs
the package's `cpu_vec.h` and `short_f32.h` beside it) is built as the package builds it (`kernels/native.py`:
-march=native less EMBEDSERVE_CPU_ISA's cap; kept under `--out`), then checked on
the first layer's projections against torch's matmul on the unpacked weights: a variant that
is fast but wrong is refused. The weights are random, in oneDNN's fp32 packing ([N/64][K][64],
what the kernel reads), one buffer per projection and layer on 2 MB pages like the engine's.
Every round runs each source over all layers (qkv, o, gate/up with silu, down), then the weight
stream alone (`torch.sum` over the same buffers, the query's streaming floor): GFLOP/s and
GB/s medians, and each source's time over the first's, paired by round (this box drifts
within minutes). `--same-layer` reuses the first layer's weights for every layer: the
kernel's rate from cache, for the compute side of the floor.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import statistics
import time
from pathlib import Path

import torch

from embedserve.kernels import native
from embedserve.worker.host_memory import on_huge_pages

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# (name, K, N, gated) per projection of a Llama/Qwen3 decoder layer
Shape = tuple[str, int, int, bool]


def shapes(cfg: dict[str, int]) -> list[Shape]:
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    return [
        ("qkv", hidden, (heads + 2 * kv) * head_dim, False),
        ("o", heads * head_dim, hidden, False),
        ("gate/up", hidden, cfg["intermediate_size"], True),
        ("down", cfg["intermediate_size"], hidden, False),
    ]


def load(source: Path, out: Path) -> ctypes.CDLL:
    """The source built as the package builds it (kept in `out` per source text and ISA cap)."""
    compiler = native.compiler()
    if compiler is None:
        raise SystemExit("no C++ compiler here")
    # the source, the headers beside it and the build command (compiler, flags, torch, cap)
    parts = [source.read_bytes(), *(h.read_bytes() for h in sorted(source.parent.glob("*.h")))]
    parts.append(" ".join(native._command(compiler, source, Path("kernel.so"))).encode())
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = out / f"{source.stem}-{key}.so"
    if not target.exists():
        native._build(compiler, source, target)
    lib = ctypes.CDLL(str(target))
    for f in (lib.embedserve_short_linear_f32, lib.embedserve_short_silu_gate_up_f32):
        f.restype = ctypes.c_int
        f.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
    return lib


def weight(numel: int) -> torch.Tensor:
    w = torch.randn(numel) * 0.02
    on_huge_pages(w.data_ptr(), w.numel() * 4)
    return w


def call(lib: ctypes.CDLL, shape: Shape, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    _, k, n, gated = shape
    rows = x.shape[0]
    if gated:
        second = w.data_ptr() + k * n * 4
        rc = lib.embedserve_short_silu_gate_up_f32(
            x.data_ptr(), rows, k, k, w.data_ptr(), second, n, y.data_ptr(), n
        )
    else:
        rc = lib.embedserve_short_linear_f32(x.data_ptr(), rows, k, k, w.data_ptr(), None, n, y.data_ptr(), n)
    if rc != 0:
        raise SystemExit(f"the kernel refused {shape} (code {rc})")


def unpacked(w: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """[N, K] of a [N/64][K][64] packing."""
    return w[: k * n].view(n // 64, k, 64).permute(0, 2, 1).reshape(n, k)


def check(lib: ctypes.CDLL, layer: list[torch.Tensor], plan: list[Shape], rows: int) -> float:
    """The largest difference to torch's matmul over the layer's projections, relative to the
    largest output."""
    worst = 0.0
    for shape, w in zip(plan, layer, strict=True):
        _, k, n, gated = shape
        x, y = torch.randn(rows, k), torch.empty(rows, n)
        call(lib, shape, w, x, y)
        ref = x @ unpacked(w, k, n).T
        if gated:
            ref = torch.nn.functional.silu(ref) * (x @ unpacked(w[k * n :], k, n).T)
        worst = max(worst, float((y - ref).abs().max() / ref.abs().max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", type=Path)
    ap.add_argument("--model", required=True, type=Path, help="a directory with config.json")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--same-layer", action="store_true", help="every layer reads the first layer's weights")
    ap.add_argument("--out", type=Path, default=Path("/tmp/embedserve-short-rows-ab"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = json.loads((args.model / "config.json").read_text())
    plan = shapes(cfg)
    if any(n % 64 for _, _, n, _ in plan):
        raise SystemExit(f"the kernel takes N in multiples of 64: {plan}")
    sources = args.sources or [native.SOURCES / "short_linear_f32.cpp"]
    args.out.mkdir(parents=True, exist_ok=True)
    libs = [load(s, args.out) for s in sources]
    first = [weight(k * n * (2 if gated else 1)) for _, k, n, gated in plan]
    layers = [
        first if args.same_layer or i == 0 else [weight(w.numel()) for w in first]
        for i in range(cfg["num_hidden_layers"])
    ]
    for source, lib in zip(sources, libs, strict=True):
        err = check(lib, first, plan, args.rows)
        print(f"{source}: largest difference to torch {err:.1e} of the largest output")
        if err > 1e-4:
            raise SystemExit(f"{source} computes something else")
    xs = {k: torch.randn(args.rows, k) for _, k, _, _ in plan}
    ys = {n: torch.empty(args.rows, n) for _, _, n, _ in plan}
    flops = len(layers) * sum(2 * args.rows * k * n * (2 if g else 1) for _, k, n, g in plan)
    nbytes = sum(w.numel() * 4 for w in first) * len(layers)
    times: list[list[float]] = [[] for _ in range(len(libs) + 1)]
    for _ in range(args.rounds):
        for i in range(len(libs) + 1):
            start = time.perf_counter()
            for layer in layers:
                for shape, w in zip(plan, layer, strict=True):
                    if i == len(libs):
                        w.sum()
                    else:
                        call(libs[i], shape, w, xs[shape[1]], ys[shape[2]])
            times[i].append(time.perf_counter() - start)
    print(f"{args.rows} rows, {len(layers)} layers, {nbytes / 1e9:.2f} GB of weights, {args.threads} threads")
    for i, label in enumerate([*map(str, sources), "weight stream (torch.sum)"]):
        med = statistics.median(times[i])
        rate = f"{nbytes / med / 1e9:.1f} GB/s" if i == len(libs) else f"{flops / med / 1e9:.0f} GFLOP/s"
        paired = sorted(b / a for a, b in zip(times[0], times[i], strict=True))
        print(
            f"{label:60s} median {med * 1000:7.1f} ms, min {min(times[i]) * 1000:7.1f}, {rate}, "
            f"over the first {paired[len(paired) // 2]:.3f}x"
        )


if __name__ == "__main__":
    main()
