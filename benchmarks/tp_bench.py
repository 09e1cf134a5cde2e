"""Tensor parallelism (#24): tokens/s of one long input at each tensor_parallel_size, the
vectors' cosine to TP=1, and each rank's weight bytes. CPU (gloo) or CUDA (NCCL, one GPU per
rank). Random-weight model directories work (e.g. benchmarks/q06.sh's 0.6B shape).

    PYTHONPATH=src python benchmarks/tp_bench.py MODEL_DIR [--tp 1,2] [--length 4096]
        [--dtype float32] [--device cpu] [--budget 2048] [--repeats 2] [--out tp.json]

TP=1 runs the same chunked path as TP>1 (`layer_major_tokens=0`: tensor parallelism has no
layer-major lane), and once more with the engine's defaults ("tp1-default") for reference.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from embedserve import Engine
from embedserve.models.loader import read_model_dir


def _vector_and_rate(engine: Engine, ids: list[int], repeats: int) -> tuple[np.ndarray, float, list[float]]:
    engine.embed([ids[:64]])  # warm-up: kernels' self-checks, first-touch pages
    times, vec = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        vec = engine.embed([ids])[0]
        times.append(time.perf_counter() - start)
    assert vec is not None
    return vec, len(ids) / statistics.median(times), times


def _weight_bytes(engine: Engine, model_dir: Path) -> list[int]:
    """Each rank's parameter bytes; TP=1: the checkpoint's tensors (lm_head excepted) at the
    engine's dtype (packed oneDNN weights report no storage)."""
    workers = engine._loop.parts.workers
    if workers is not None:
        return list(workers.rank_weight_bytes)
    total = 0
    for f in read_model_dir(model_dir).weight_files:
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():  # noqa: SIM118 - safe_open is not a dict
                if not name.startswith("lm_head."):
                    total += math.prod(h.get_slice(name).get_shape()) * engine.config.dtype.itemsize
    return [total]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--tp", default="1,2", help="comma-separated sizes (default 1,2)")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--default-tp1", action="store_true", help="also TP=1 with the engine's defaults")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    ids = [int(x) for x in np.random.default_rng(0).integers(0, 151643, size=a.length)]
    runs: list[dict[str, Any]] = []
    base = None
    cases = [(int(n), {"layer_major_tokens": 0} if int(n) == 1 else {}) for n in a.tp.split(",")]
    if a.default_tp1:
        cases.append((1, {}))
    for size, extra in cases:
        opts = {"dtype": a.dtype, "device": a.device, "max_num_batched_tokens": a.budget, **extra}
        start = time.perf_counter()
        with Engine.from_pretrained(a.model, tensor_parallel_size=size, **opts) as engine:
            load_s = time.perf_counter() - start
            vec, rate, times = _vector_and_rate(engine, ids, a.repeats)
            nbytes = _weight_bytes(engine, a.model)
        base = vec if base is None else base
        cos = float(np.dot(vec, base) / (np.linalg.norm(vec) * np.linalg.norm(base)))
        name = f"tp{size}" + ("-default" if size == 1 and not extra else "")
        row = {"case": name, "tokens_per_s": round(rate, 1), "times_s": [round(t, 2) for t in times]}
        row |= {"load_s": round(load_s, 1), "rank_weight_bytes": nbytes, "cosine_vs_first": cos}
        print(json.dumps(row), flush=True)
        runs.append(row)
    result = {"model": str(a.model), "length": a.length, "dtype": a.dtype, "device": a.device}
    result |= {"budget": a.budget, "threads": torch.get_num_threads(), "runs": runs}
    if a.out is not None:
        a.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
