"""The measured phases: fp32 reference vectors, engine throughput, transformers throughput.

Each returns a JSON-able dict; vectors are L2-normalized last-token states (Qwen3-Embedding).
"""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Iterator
from concurrent.futures import wait
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from models import Shape, build_hf_model

from embedserve.engine.ask import Ask
from embedserve.engine.engine import Engine

MAX_ID = 151643  # ordinary-token ids only (specials start here in the Qwen vocabulary)


def random_inputs(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n random token-id sequences; the same seed gives the same first rows for any n."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(vocab, MAX_ID), size=(n, length)).tolist()


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def latency_stats(latencies: list[float]) -> dict[str, float]:
    lat = np.asarray(latencies)
    return {"p50_s": float(np.percentile(lat, 50)), "p95_s": float(np.percentile(lat, 95))}


def matmul_tflops(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """Measured dense bf16 matmul rate (the ceiling this chip reaches through PyTorch)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


@contextmanager
def repeated_kv_heads() -> Iterator[None]:
    """Make transformers widen K/V heads itself instead of asking SDPA for GQA.

    In float32 no fused CUDA kernel takes GQA (flash needs 16-bit, the memory-efficient
    kernel has no GQA), so SDPA would fall back to its math backend and materialize
    [heads, 16K, 16K] float32 scores (34 GB per layer at 16K). With widened heads the
    memory-efficient kernel runs the same math in float32.
    """
    sdpa: Any = importlib.import_module("transformers.integrations.sdpa_attention")
    original = getattr(sdpa, "use_gqa_in_sdpa", None)
    if original is None:  # a transformers without the switch: nothing to steer
        yield
        return
    sdpa.use_gqa_in_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        sdpa.use_gqa_in_sdpa = original


def reference_vectors(
    shape: Shape, seed: int, device: torch.device, inputs: list[list[int]]
) -> dict[str, Any]:
    """transformers fp32 (SDPA), one sequence at a time: the parity reference."""
    t = time.perf_counter()
    model = build_hf_model(shape, seed, device, torch.float32)
    built = time.perf_counter() - t
    vectors = []
    with torch.inference_mode(), repeated_kv_heads():
        for ids in inputs:
            hidden = model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0, -1]
            vectors.append(torch.nn.functional.normalize(hidden.float(), dim=-1).cpu().numpy())
    sync(device)
    del model
    free(device)
    return {"vectors": np.stack(vectors), "build_s": built, "wall_s": time.perf_counter() - t}


def engine_parity(
    engine: Engine, inputs: list[list[int]], reference: np.ndarray, bar: float
) -> dict[str, Any]:
    """All parity inputs in flight together (chunked by the engine's token budget)."""
    vectors = engine.embed(inputs, priority="batch")
    cos = np.sum(vectors * reference, axis=-1)  # both L2-normalized
    lengths = [len(x) for x in inputs]
    return {
        "cosine": {str(n): float(c) for n, c in zip(lengths, cos, strict=True)},
        "min_cosine": float(cos.min()),
        "bar": bar,
        "passed": bool(cos.min() >= bar),
    }


def engine_throughput(
    engine: Engine,
    shape: Shape,
    length: int,
    max_requests: int,
    budget_s: float,
    seed: int,
    device: torch.device,
) -> dict[str, Any]:
    """Warm up, calibrate on a few requests, then submit as many as fit the budget, all at once."""
    t_phase = time.perf_counter()
    engine.embed(random_inputs(2, length, shape.vocab, seed + 1), priority="batch")  # kernels, allocator
    calib = 2 if length >= 8192 else 8
    t = time.perf_counter()
    engine.embed(random_inputs(calib, length, shape.vocab, seed + 2), priority="batch")
    rate = calib * length / (time.perf_counter() - t)  # tokens/s
    left = budget_s - (time.perf_counter() - t_phase)
    n = int(min(max_requests, max(4, 0.8 * left * rate / length)))
    inputs = random_inputs(n, length, shape.vocab, seed)
    reset_peak(device)
    futures = engine.submit(engine.prepare(inputs, Ask(priority="batch")))
    # Hard stop near the phase budget even if calibration was far off: unfinished requests
    # are cancelled (the engine aborts them) and the phase reports what completed.
    timeout = max(1.2 * left, 10.0)
    done, pending = wait(futures, timeout=timeout)
    for f in pending:
        f.cancel()
    errors = [e for f in done if (e := f.exception()) is not None]
    finished = [f.result() for f in futures if f in done and f.exception() is None]
    if not finished:
        raise errors[0] if errors else RuntimeError(f"no request finished in {timeout:.0f} s")
    wall = max(fin.finish_time for fin in finished) - min(fin.request.arrival_time for fin in finished)
    lat = [fin.finish_time - fin.request.arrival_time for fin in finished]
    tokens = len(finished) * length
    return {
        "backend": "embedserve",
        "requests": n,
        "completed": len(finished),
        "timed_out": bool(pending),
        "failed": len(errors),
        "first_error": repr(errors[0]) if errors else None,
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "req_s": len(finished) / wall,
        **latency_stats(lat),
        "peak_gib": peak_gib(device),  # includes the KV cache pool, allocated up front
        "kv_cache_gib": engine.config.cache.kv_cache_memory / 2**30
        if engine.config.cache.kv_cache_memory
        else None,
        "calibration_tok_s": rate,
        "first_vectors": np.stack([fin.vector.numpy() for fin in finished[:4] if fin.vector is not None]),
    }


def hf_throughput(
    model: torch.nn.Module,
    shape: Shape,
    length: int,
    max_requests: int,
    batch: int,
    budget_s: float,
    seed: int,
    device: torch.device,
) -> dict[str, Any]:
    """transformers as a user runs it: fixed-size batches of equal-length inputs, one after another."""
    inputs = random_inputs(max_requests, length, shape.vocab, seed)
    finishes: list[float] = []
    first: list[np.ndarray] = []
    with torch.inference_mode():
        model(input_ids=torch.tensor(inputs[:1], device=device))  # warm-up at this length
        sync(device)
        reset_peak(device)
        t0 = time.perf_counter()
        for start in range(0, len(inputs), batch):
            if finishes and time.perf_counter() - t0 > budget_s:
                break
            ids = torch.tensor(inputs[start : start + batch], device=device)
            hidden = model(input_ids=ids).last_hidden_state[:, -1]
            vectors = torch.nn.functional.normalize(hidden.float(), dim=-1).cpu().numpy()  # syncs
            finishes += [time.perf_counter() - t0] * len(ids)
            first += list(vectors[: max(0, 4 - len(first))])
    tokens = len(finishes) * length
    wall = finishes[-1]
    return {
        "backend": "transformers-sdpa",
        "batch": batch,
        "requests": len(finishes),
        "completed": len(finishes),
        "timed_out": len(finishes) < max_requests,
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "req_s": len(finishes) / wall,
        **latency_stats(finishes),  # every request was waiting from t0, as if all were sent at once
        "peak_gib": peak_gib(device),
        "first_vectors": np.stack(first),
    }
