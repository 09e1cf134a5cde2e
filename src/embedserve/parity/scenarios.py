"""The preemption scenario: a ~15,500-token input alone vs among 64 concurrent requests.

The scheduler only preempts when a more urgent request needs blocks that a less urgent one
holds, so the pressure run is arranged to make that happen:

    KV cache = exactly the long input's blocks; per-step budget B <= 512 tokens (and <= long / 16)
    t0  long input submitted as `batch`            -> computes chunk by chunk, holding blocks
    t1  it holds all but ~4 B of its blocks        -> 63 `online` requests of B/2 .. 8 B tokens arrive
        an online request outgrowing the ~4 B free tokens preempts the long input (recompute);
        later the long input ages into the online class and preempts partial online requests

The gate: every vector of the pressure run matches (long: vs alone and vs the reference;
others: vs the reference) with cosine >= 0.999, and the engine counted preemptions > 0.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from embedserve.embedders.engine import EngineSource, open_engine
from embedserve.engine.ask import Ask
from embedserve.engine.engine import EmbeddingOutput, Engine
from embedserve.parity.backends import Backend
from embedserve.parity.datasets import Item
from embedserve.parity.embedding import embed_side
from embedserve.parity.metrics import cosine_rows
from embedserve.parity.options import ParityError

NUM_REQUESTS = 64
MAX_BUDGET = 512  # per-step tokens in the pressure run: many steps, so the flood lands in time
WINDOW_STEPS = 4  # the flood arrives when the long input has this many steps left
MAX_ATTEMPTS = 3  # a flood that arrives after the long input finished cannot preempt it


async def _flood(engine: Engine, long: list[int], others: list[list[int]], threshold: int) -> list[Any]:
    start = engine.stats()["tokens_computed"]
    long_task = asyncio.ensure_future(engine.run_async([long], Ask(priority="batch")))
    while engine.stats()["tokens_computed"] - start < threshold and not long_task.done():
        await asyncio.sleep(0.0005)
    flood = [asyncio.ensure_future(engine.run_async([o], Ask(priority="online"))) for o in others]
    return list(await asyncio.gather(long_task, *flood))


def _pressure_run(
    engine: Engine, long: list[int], others: list[list[int]], threshold: int
) -> tuple[list[EmbeddingOutput], list[dict[str, Any]]]:
    attempts: list[dict[str, Any]] = []
    outputs: list[EmbeddingOutput] = []
    for _ in range(MAX_ATTEMPTS):
        before = engine.stats()["preemptions"]
        start = time.perf_counter()
        outputs = [batch[0] for batch in asyncio.run(_flood(engine, long, others, threshold))]
        preempted = engine.stats()["preemptions"] - before
        attempts.append(
            {
                "preemptions": preempted,
                "long_input_preemptions": outputs[0].num_preemptions,
                "seconds": round(time.perf_counter() - start, 3),
            }
        )
        if preempted > 0:
            break
    return outputs, attempts


def run_preemption(
    reference: Backend,
    candidate: Backend,
    ordinary_ids: Sequence[int],
    length: int,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    """Runs the scenario; `other_tokens` in the result is [min, max, total] of the 63 others."""
    if not isinstance(candidate, EngineSource):
        raise ParityError("--scenario preemption needs an engine:PATH candidate (it reads engine statistics)")
    base = candidate.engine
    sched, cache = base.config.scheduler, base.config.cache
    if length > sched.max_model_len:
        raise ParityError(f"--scenario-length {length} exceeds the candidate's limit ({sched.max_model_len})")
    pool = np.asarray(ordinary_ids)
    rng = np.random.default_rng(seed)
    long = [int(t) for t in rng.choice(pool, size=length)]
    budget = max(1, min(sched.max_num_batched_tokens, MAX_BUDGET, length // 16))
    # About half the others outgrow the ~WINDOW_STEPS * budget tokens left free at the flood.
    sizes = rng.integers(max(budget // 2, 1), 2 * WINDOW_STEPS * budget + 1, NUM_REQUESTS - 1)
    others = [[int(t) for t in rng.choice(pool, size=int(n))] for n in sizes]

    alone = base.embed([long])[0]
    assert cache.kv_cache_memory is not None
    per_block = cache.kv_cache_memory // base.stats()["kv_blocks_total"]
    blocks = -(-length // cache.block_size)
    # Chunked prefill only: a layer-major input holds no KV blocks, so nothing would preempt it.
    assert candidate.options is not None  # opened from its spec
    options = candidate.options.replace(
        kv_cache_memory=blocks * per_block, max_num_batched_tokens=budget, layer_major_tokens=0
    )
    threshold = length - WINDOW_STEPS * budget
    with open_engine(base.config.model_path, options) as engine:
        kv_blocks = engine.stats()["kv_blocks_total"]
        outputs, attempts = _pressure_run(engine, long, others, threshold)
        stats = engine.stats()

    pressured = np.stack([o.embedding for o in outputs])
    ids = [tuple(long), *[tuple(o) for o in others]]
    items: list[Item] = list(ids)
    lengths = [len(i) for i in ids]
    ref, _ = embed_side(reference, items, "", lengths, None, "preemption reference", progress)
    vs_ref = cosine_rows(pressured, ref)
    vs_alone = float(cosine_rows(pressured[:1], alone[None])[0])
    return {
        "long_tokens": length,
        "num_requests": NUM_REQUESTS,
        "other_tokens": [min(map(len, others)), max(map(len, others)), sum(map(len, others))],
        "kv_blocks": kv_blocks,
        "kv_tokens": kv_blocks * cache.block_size,
        "max_num_batched_tokens": budget,
        "flood_after_tokens": threshold,
        "attempts": attempts,
        "preemptions": attempts[-1]["preemptions"],
        "long_input_preemptions": outputs[0].num_preemptions,
        "requests_preempted": sum(o.num_preemptions > 0 for o in outputs),
        "cosine_long_vs_alone": vs_alone,
        "cosine_long_vs_reference": float(vs_ref[0]),
        "cosine_others_vs_reference_min": float(vs_ref[1:].min()),
        "cosine_alone_vs_reference": float(cosine_rows(alone[None], ref[:1])[0]),
        "min_cosine": float(min(vs_alone, vs_ref.min())),
        "engine_stats": stats,
    }
