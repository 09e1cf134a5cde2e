"""Weight-only int8 (`quantization="int8-weights"`) against float32 on short queries, side by
side in one process, rounds alternating, ratios paired by round (this box drifts within minutes).

    python benchmarks/weight_int8.py --model /tmp/embedserve-bench-models/q06 \
        [--tokens 1,4,16] [--queries 20] [--rounds 5] [--kernels-only]

1. The projections alone: every layer's weights of the model's shapes (random, one buffer per
   projection and layer, as a query reads them from memory) through the float32 short-rows
   kernel (its packing) and the int8-weight kernel (Q8_0's form), per row count; the results
   checked bit for bit first (the int8 kernel is the float32 one on the dequantized weight),
   then timed; the weight stream of each (`torch.sum` over the same bytes) beside.
2. The engine: the model built twice (float32; int8-weights), one query of each token count
   stepped to completion on each, alternating; p50 per engine and round, the ratio per round,
   and the cosine of the two engines' vectors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from gflops import projection_shapes  # benchmarks/, first on the path when run as a script

from embedserve.engine.builder import build_engine
from embedserve.kernels import short_linear, weight_int8
from embedserve.models.weight_int8 import q8_0
from embedserve.request import EmbedParams, Priority, Request


def _layers(cfg: dict[str, int], count: int) -> list[list[tuple[str, torch.Tensor, weight_int8.Blocks]]]:
    """Per layer and projection: (name, float32 weight in the kernel's packing, int8 blocks)."""
    out = []
    for _ in range(count):
        layer = []
        for name, (k, n) in projection_shapes(cfg).items():
            w8 = q8_0(torch.randn(n, k) * 0.02)
            plain = w8.dequantized()
            packed = plain.view(n // 64, 64, k).permute(0, 2, 1).contiguous()
            layer.append((name, packed, w8))
        out.append(layer)
    return out


def _f32(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    nb, k, _ = packed.shape
    return short_linear.linear(x, short_linear.Packed(packed.data_ptr(), torch.float32, nb * 64, k, packed))


def kernels(cfg: dict[str, int], rows_list: list[int], rounds: int) -> None:
    layers = _layers(cfg, cfg["num_hidden_layers"])
    f32_bytes = sum(p.numel() * 4 for layer in layers for _, p, _ in layer)
    w8_bytes = sum(b.nbytes for layer in layers for _, _, b in layer)
    for _, packed, blocks in layers[0]:
        x = torch.randn(7, blocks.k)
        if not torch.equal(_f32(x, packed), weight_int8.linear(x, blocks)):
            raise SystemExit("the int8-weight kernel is not the float32 kernel on the dequantized weight")
    print(f"{len(layers)} layers: float32 {f32_bytes / 1e9:.2f} GB, int8 weights {w8_bytes / 1e9:.2f} GB")
    stream32, stream8 = torch.ones(f32_bytes // 4), torch.ones(w8_bytes // 4)
    for rows in rows_list:
        xs = {b.k: torch.randn(rows, b.k) for _, _, b in layers[0]}
        times: dict[str, list[float]] = {"float32": [], "int8 weights": [], "stream 32": [], "stream 8": []}
        for _ in range(rounds):
            for name in times:
                t = time.perf_counter()
                if name == "stream 32":
                    stream32.sum()
                elif name == "stream 8":
                    stream8.sum()
                else:
                    for layer in layers:
                        for _, packed, blocks in layer:
                            x = xs[blocks.k]
                            _ = _f32(x, packed) if name == "float32" else weight_int8.linear(x, blocks)
                times[name].append(time.perf_counter() - t)
        ratio = statistics.median(a / b for a, b in zip(times["int8 weights"], times["float32"], strict=True))
        line = ", ".join(f"{n} {statistics.median(t) * 1e3:.1f} ms" for n, t in times.items())
        print(f"projections, {rows} rows: {line}; int8 / float32 per round (median) {ratio:.3f}")


def engines(model: str, tokens_list: list[int], queries: int, rounds: int) -> None:
    built = {name: build_engine(model, dtype="float32", **opts) for name, opts in
             (("float32", {}), ("int8-weights", {"quantization": "int8-weights"}))}  # fmt: skip
    ids = iter(range(1, 1 << 30))

    def query(name: str, tokens: list[int]) -> np.ndarray:
        core, cfg = built[name].core, built[name].config
        core.add(Request(next(ids), tokens, EmbedParams(normalize=True), cfg.pooling.method, Priority.ONLINE))
        done = []
        while core.has_work:
            done += core.step()
        return done[0].vector.float().numpy()

    for n in tokens_list:
        tokens = list(range(1000, 1000 + n))
        vectors = {name: query(name, tokens) for name in built}
        cos = float(np.dot(vectors["float32"], vectors["int8-weights"]))
        for name in built:  # warm-up
            for _ in range(3):
                query(name, tokens)
        p50: dict[str, list[float]] = {name: [] for name in built}
        for _ in range(rounds):
            for name in built:
                lat = []
                for _ in range(queries):
                    t = time.perf_counter()
                    query(name, tokens)
                    lat.append(time.perf_counter() - t)
                p50[name].append(statistics.median(lat) * 1e3)
        per_round = [a / b for a, b in zip(p50["int8-weights"], p50["float32"], strict=True)]
        print(
            f"query of {n} tokens: p50 float32 {statistics.median(p50['float32']):.1f} ms, int8-weights "
            f"{statistics.median(p50['int8-weights']):.1f} ms; int8-weights / float32 per round "
            f"{' / '.join(f'{r:.2f}' for r in per_round)}; cosine {cos:.6f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model directory (config.json: its shapes)")
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernels-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not (weight_int8.available() and short_linear.available(torch.float32)):
        raise SystemExit("the float32 and int8-weight short-rows kernels need AVX2 + FMA and a C++ compiler")
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    counts = [int(t) for t in args.tokens.split(",")]
    with torch.inference_mode():
        kernels(cfg, counts, args.rounds)
        if not args.kernels_only:
            engines(args.model, counts, args.queries, args.rounds)


if __name__ == "__main__":
    main()
