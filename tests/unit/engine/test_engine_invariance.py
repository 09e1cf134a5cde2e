"""Invariance gates: alone == in a batch, chunked == unchunked, preempted == not preempted."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.request import EmbedParams, Priority, Request
from tests.helpers.engine_calls import submit
from tests.helpers.reference import cosine, hf_embed_ids, random_ids

FP32_MIN_COSINE = 0.99999
# KV bytes per 16-token block of the tiny Qwen3: 2 layers x (k, v) x 16 x 2 kv heads x 32 x 4 B.
BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4


def test_alone_equals_inside_a_mixed_batch(qwen3_dir: Path) -> None:
    target = random_ids(777, seed=11)
    others = [random_ids(n, seed=n) for n in (5, 1500, 64, 3000, 1)]
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=256) as engine:
        alone = engine.embed([target])[0]
        mixed = engine.embed([*others[:2], target, *others[2:]])
    assert cosine(alone[None], mixed[2][None])[0] >= FP32_MIN_COSINE


def test_chunked_equals_unchunked(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n + 3) for n in (129, 2000)]
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=4096) as engine:
        whole = engine.embed(seqs)
        assert engine.stats()["steps"] == 1
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=33) as engine:
        chunked = engine.embed(seqs)
    assert cosine(whole, chunked).min() >= FP32_MIN_COSINE


def test_forced_preemption_changes_nothing(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n + 5) for n in (900, 1200, 400, 1250, 1260, 1270)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    # 1,280 cached tokens: an online prompt of >= 1,250 tokens arriving while any batch
    # prompt holds more than two blocks must evict it.
    with Engine.from_pretrained(
        qwen3_dir, max_num_batched_tokens=128, kv_cache_memory=80 * BLOCK_BYTES, max_model_len=1280
    ) as engine:
        assert engine.stats()["kv_blocks_total"] == 80
        batch_futs, _ = submit(engine, seqs[:3], priority="batch")
        while engine.stats()["tokens_computed"] < 300:
            time.sleep(0.005)
        online = engine.embed(seqs[3:])
        batch = np.stack([f.result().vector.numpy() for f in batch_futs])  # type: ignore[union-attr]
        stats = engine.stats()
    assert stats["preemptions"] > 0
    assert stats["kv_blocks_used"] == 0  # everything given back
    assert cosine(np.concatenate([batch, online]), ref).min() >= FP32_MIN_COSINE


def _request(rid: int, ids: list[int], priority: Priority) -> Request:
    return Request(rid, ids, EmbedParams(normalize=True), PoolingMethod.LAST, priority)


def test_long_prompt_among_64_concurrent_survives_preemption(qwen3_dir: Path) -> None:
    """Driven step by step (no thread) so the preemption of the long prompt is certain."""
    big = random_ids(15_500, seed=42)
    rng = np.random.default_rng(0)
    others = [random_ids(int(n), seed=1000 + i) for i, n in enumerate(rng.integers(100, 1500, size=63))]
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=16_384, max_model_len=16_384) as engine:
        alone = engine.embed([big])[0]
        assert engine.stats()["steps"] == 1  # the baseline is one unchunked pass
    # 970 blocks = 15,520 cached tokens: the long document barely fits alone.
    core = build_engine(
        qwen3_dir,
        max_num_batched_tokens=2048,
        max_model_len=16_384,
        kv_cache_memory=970 * BLOCK_BYTES,
        layer_major_tokens=0,  # the chunked path under preemption (the lane holds no blocks)
    ).core
    long_req = _request(0, big, Priority.BATCH)
    core.add(long_req)
    # At least 12,288 of its 15,500 tokens computed and cached. Batch steps alone are sized by the
    # speed steps ran at (scheduler/policy.py LULL_STEP_S), so their count depends on the machine;
    # each is at most 2,048 tokens, so the request stops short of its end.
    while long_req.num_computed_tokens < 6 * 2048:
        assert core.step() == []
    assert long_req.num_computed_tokens < 7 * 2048
    flood = [_request(i + 1, ids, Priority.ONLINE) for i, ids in enumerate(others)]
    for r in flood:
        core.add(r)
    vectors: dict[int, np.ndarray] = {}
    for _ in range(1000):
        for fin in core.step():
            assert fin.error is None and fin.vector is not None
            vectors[fin.request.request_id] = fin.vector.numpy()
        if not core.has_work:
            break
    assert len(vectors) == 64 and not core.has_work
    stats = core.stats()
    assert long_req.num_preemptions > 0 and stats["preemptions"] >= long_req.num_preemptions
    assert stats["kv_blocks_used"] == 0
    assert cosine(alone[None], vectors[0][None])[0] >= FP32_MIN_COSINE
    sample = [0, 31, 62]
    ref = hf_embed_ids(qwen3_dir, [others[i] for i in sample])
    got = np.stack([vectors[i + 1] for i in sample])
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
