"""Prefix caching over the paged KV cache: the block pool's sharing and eviction, the hash chain,
and the engine's vectors with prefix hits against sentence-transformers / transformers (an
independent reference) and against the same engine without the cache: shared prefixes, a hit
whose suffix runs in several chunks, preemption of requests that hold shared blocks, eviction
under pressure, the poolings that may and may not use it, and where it is off or refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.errors import ModelLoadError
from embedserve.kv_cache.block_pool import BlockPool
from embedserve.kv_cache.manager import KVCacheManager, block_hashes
from tests.helpers.reference import cosine, hf_embed_ids, random_ids, st_embed
from tests.helpers.tiny_models import QUERY_PROMPT

FP32_MIN_COSINE = 0.99999
QUERIES = ["how do wings make lift", "shock waves at Mach one", "boundary layers", "why do planes fly?"]


def _stats(engine: Engine) -> dict[str, int]:
    return engine.stats()


def _kv_bytes(model_dir: Path, blocks: int) -> int:
    """kv_cache_memory that holds exactly `blocks` blocks of 16 tokens (fp32)."""
    import torch

    from embedserve.models.open import open_model
    from embedserve.worker.model_runner import kv_bytes_per_block

    return blocks * kv_bytes_per_block(open_model(model_dir).model, 16, torch.float32)


# ---- the block pool and the hash chain ----------------------------------------------------


def test_shared_blocks_are_released_by_their_last_holder_then_cached_lru_first() -> None:
    pool = BlockPool(4, max_cached=2)
    a = pool.take(2)
    assert a is not None and pool.register(a[0], b"h0") and pool.register(a[1], b"h1")
    assert not pool.register(a[1], b"other")  # one hash per block, one block per hash
    pool.share([a[0]])  # a second request starts from block a[0]
    pool.give_back(a)  # the first lets go: a[0] still held, a[1] cached
    assert pool.refs(a[0]) == 1 and pool.by_hash == {b"h0": a[0], b"h1": a[1]}
    assert pool.num_free == 3 and pool.num_used == 1
    pool.give_back([a[0]])  # now both cached, a[1] least recently released
    assert pool.num_free == 4 and pool.num_cached == 2
    fresh = pool.take(3)  # two free blocks first, then the oldest cached one (a[1]) evicted
    assert fresh is not None and a[1] in fresh and pool.by_hash == {b"h0": a[0]}
    assert pool.take(2) is None  # only a[0] left: taking nothing


def test_the_cache_keeps_at_most_max_cached_unheld_blocks() -> None:
    pool = BlockPool(8, max_cached=2)
    blocks = pool.take(5)
    assert blocks is not None
    for i, b in enumerate(blocks):
        pool.register(b, bytes([i]))
    pool.give_back(blocks)
    assert pool.num_cached == 2 and pool.num_free == 8  # the three oldest forgotten
    assert set(pool.by_hash) == {bytes([3]), bytes([4])}


def test_the_hash_chain_covers_every_earlier_token() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(a) == 3  # full blocks only
    b = block_hashes([9, 2, 3, 4, 5, 6], 2)  # a different first token: every block differs
    assert not set(a) & set(b)
    assert block_hashes([1, 2, 3, 4, 8, 8], 2)[:2] == a[:2]  # same prefix, same leading digests


def test_a_prefix_is_matched_block_by_block_and_counted_once_reclaimable() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=2, max_cached=4)
    ids = [1, 2, 3, 4, 5, 6, 7]
    hashes = block_hashes(ids, 2)
    assert kv.allocate_slots(0, 0, 7) is not None
    kv.register(0, hashes, 5)  # tokens < 5 computed: blocks 0 and 1 are full and known
    assert kv.attach_prefix(1, ids, hashes, most=6) == (4, None)
    assert kv.block_table(1) == kv.block_table(0)[:2]
    assert kv.reclaimable([0]) == 2  # its two shared blocks stay with request 1
    assert kv.reclaimable([0, 1]) == 4
    assert kv.attach_prefix(2, ids, hashes, most=3) == (2, None)  # `most`: what its pooling may skip
    assert kv.attach_prefix(3, [7, 7, 7, 7], block_hashes([7, 7, 7, 7], 2), most=4) == (0, None)


def test_a_pinned_prompt_tail_is_copied_into_a_block_of_the_requests_own() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, max_cached=2)
    prompt = [1, 2, 3, 4, 5, 6, 7]  # one full block and a 3-token tail
    ids = [*prompt, 50]
    assert kv.allocate_slots(0, 0, len(ids)) is not None
    kv.register(0, block_hashes(ids, 4), len(ids))
    kv.pin_prompt(0, ids, block_hashes(ids, 4), len(prompt))
    pinned = set(kv.block_table(0))
    kv.free(0)
    assert kv.pinned == pinned and kv.pool.num_used == 2  # held for good
    query = [*prompt, 60, 61, 62]
    hit, copy = kv.attach_prefix(1, query, block_hashes(query, 4), most=len(query) - 1)
    assert hit == 7 and copy is not None and copy.rows == 3
    assert copy is not None and copy.src in pinned and copy.dst not in pinned
    assert kv.block_table(1) == [kv.block_table(1)[0], copy.dst] and kv.block_table(1)[0] in pinned
    # A query that leaves the tail after two of its tokens (a merged boundary token): two rows.
    other = [1, 2, 3, 4, 5, 6, 99, 98]
    hit, copy = kv.attach_prefix(2, other, block_hashes(other, 4), most=len(other) - 1)
    assert hit == 6 and copy is not None and copy.rows == 2
    # Pinning the same prompt again holds nothing more.
    used = kv.pool.num_used
    assert kv.allocate_slots(3, 0, len(ids)) is not None
    kv.pin_prompt(3, ids, block_hashes(ids, 4), len(prompt))
    kv.free(3)
    assert kv.pool.num_used == used


# ---- the engine -------------------------------------------------------------------------


def test_hits_match_sentence_transformers_and_the_engine_without_cache(qwen3_dir: Path) -> None:
    ref = st_embed(qwen3_dir, QUERIES, prompt_name="query")
    with Engine.from_pretrained(qwen3_dir, enable_prefix_caching=False) as off:
        cold = np.stack(off.embed(QUERIES, prompt_name="query"))
        assert _stats(off)["prefix_query_tokens"] == 0
    with Engine.from_pretrained(qwen3_dir) as engine:
        first = np.stack(engine.embed(QUERIES[:1], prompt_name="query"))  # fills the cache
        got = np.stack(engine.embed(QUERIES, prompt_name="query"))
        stats = _stats(engine)
    prompt_blocks = len(engine.tokenizer.backend.encode(QUERY_PROMPT).ids) // 16
    assert prompt_blocks >= 1 and stats["prefix_hit_tokens"] >= len(QUERIES) * prompt_blocks * 16
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    assert np.abs(got - cold).max() < 1e-5 and np.abs(first[0] - cold[0]).max() < 1e-5


def test_a_cached_prompt_is_reused_whole_tail_included(qwen3_dir: Path) -> None:
    ref = st_embed(qwen3_dir, QUERIES, prompt_name="query")
    with Engine.from_pretrained(qwen3_dir) as engine:
        n = engine.cache_prompt(QUERY_PROMPT)
        assert (
            n == len(engine.tokenizer.backend.encode(QUERY_PROMPT, add_special_tokens=False).ids) and n % 16
        )
        got = np.stack(engine.embed(QUERIES, prompt_name="query"))
        stats = _stats(engine)
        pinned = len(engine._loop.core.scheduler.kv.pinned)
    # Every query reuses the full block and the tail (all of it, or all but a boundary token
    # that merges with the query's first characters).
    assert stats["prefix_hit_tokens"] >= len(QUERIES) * (n - 1) and pinned == 2
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    with Engine.from_pretrained(qwen3_dir, enable_prefix_caching=False) as off:
        assert off.cache_prompt(QUERY_PROMPT) == 0
        cold = np.stack(off.embed(QUERIES, prompt_name="query"))
    assert np.abs(got - cold).max() < 1e-5


def test_a_hit_whose_suffix_runs_in_several_chunks(qwen3_dir: Path) -> None:
    prefix = random_ids(100, seed=1)
    seqs = [prefix + random_ids(n, seed=n) for n in (1, 40, 300)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=32) as engine:
        engine.embed([[*prefix, 5]])
        got = engine.embed(seqs)
        assert _stats(engine)["prefix_hit_tokens"] == 3 * 96  # six full 16-token blocks each
    assert cosine(got, ref).min() >= FP32_MIN_COSINE


def test_preempting_requests_that_hold_shared_blocks_leaves_the_others_right(qwen3_dir: Path) -> None:
    prefix = random_ids(64, seed=2)
    seqs = [prefix + random_ids(200 + 17 * i, seed=100 + i) for i in range(6)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    # 40 blocks of 16 tokens: the six requests (17-22 blocks each, 4 of them shared) cannot all fit.
    kv_bytes = _kv_bytes(qwen3_dir, 40)
    with Engine.from_pretrained(qwen3_dir, kv_cache_memory=kv_bytes, max_num_batched_tokens=64) as engine:
        engine.embed([[*prefix, 7]])
        engine.embed(seqs[:1], priority="batch")
        got = engine.embed(seqs)
        stats = _stats(engine)
    assert stats["kv_blocks_total"] == 40
    assert stats["prefix_hit_tokens"] > 0 and stats["kv_blocks_used"] == 0
    assert cosine(np.stack(got), ref).min() >= FP32_MIN_COSINE


def test_preemption_of_requests_holding_shared_blocks_is_certain_and_harmless(qwen3_dir: Path) -> None:
    """Driven step by step (no thread): a long batch request is part-way when online requests
    that start with its prefix arrive, share its prefix blocks and take the rest of its blocks;
    its shared blocks stay with them; every vector stays right and every block comes back."""
    from embedserve.config import PoolingMethod
    from embedserve.engine.builder import build_engine
    from embedserve.request import EmbedParams, Priority, Request

    prefix = random_ids(48, seed=3)
    batch = [[*prefix, *random_ids(560, seed=200)]]  # 38 of the 40 blocks
    online = [[*prefix, *random_ids(150, seed=300 + i)] for i in range(4)]
    ref = hf_embed_ids(qwen3_dir, batch + online)
    core = build_engine(
        qwen3_dir, kv_cache_memory=_kv_bytes(qwen3_dir, 40), max_num_batched_tokens=64, layer_major_tokens=0
    ).core

    def request(rid: int, ids: list[int], priority: Priority) -> Request:
        return Request(rid, ids, EmbedParams(normalize=True), PoolingMethod.LAST, priority)

    warm = request(99, [*prefix, 1], Priority.ONLINE)
    core.add(warm)
    while core.has_work:
        core.step()
    core.scheduler.allowance.last_online_s = None  # no online traffic lately: whole batch steps
    for i, ids in enumerate(batch):
        core.add(request(i, ids, Priority.BATCH))
    for _ in range(8):
        core.step()
    for i, ids in enumerate(online):
        core.add(request(10 + i, ids, Priority.ONLINE))
    vectors: dict[int, np.ndarray] = {}
    for _ in range(500):
        for fin in core.step():
            assert fin.error is None and fin.vector is not None
            vectors[fin.request.request_id] = fin.vector.numpy()
        if not core.has_work:
            break
    stats = core.stats()
    assert stats["preemptions"] > 0 and stats["prefix_hit_tokens"] >= 4 * 48
    assert stats["kv_blocks_used"] == 0 and core.scheduler.kv.pool.num_free == stats["kv_blocks_total"]
    got = np.stack([vectors[i] for i in [0, 10, 11, 12, 13]])
    assert cosine(got, ref).min() >= FP32_MIN_COSINE


def test_eviction_under_pressure_recomputes_right(qwen3_dir: Path) -> None:
    prefixes = [random_ids(64, seed=400 + i) for i in range(12)]
    seqs = [[*p, 11] for p in prefixes]
    ref = hf_embed_ids(qwen3_dir, seqs)
    kv_bytes = _kv_bytes(qwen3_dir, 32)  # at most 4 of them cached
    with Engine.from_pretrained(qwen3_dir, kv_cache_memory=kv_bytes) as engine:
        for s in seqs:
            engine.embed([s])
        assert _stats(engine)["prefix_cached_blocks"] <= 4
        again = engine.embed(seqs)  # the early prefixes were evicted: recomputed
        assert _stats(engine)["prefix_cached_blocks"] <= 4
    assert cosine(np.stack(again), ref).min() >= FP32_MIN_COSINE


def test_mean_pooling_uses_the_cache_only_inside_the_excluded_prompt(qwen2_dir: Path, tmp_path: Path) -> None:
    d = shutil.copytree(qwen2_dir, tmp_path / "no-prompt")
    cfg_file = d / "1_Pooling" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "include_prompt": False}))
    ref = st_embed(d, QUERIES, prompt_name="query")
    with Engine.from_pretrained(d) as engine:
        engine.embed(QUERIES[:1], prompt_name="query")
        got = engine.embed(QUERIES, prompt_name="query")
        hit = _stats(engine)["prefix_hit_tokens"]
    prompt_len = len(engine.tokenizer.backend.encode(QUERY_PROMPT).ids)
    assert 0 < hit <= len(QUERIES) * prompt_len  # never past the prompt it leaves out
    assert cosine(np.stack(got), ref).min() >= FP32_MIN_COSINE
    # MEAN over every row (the prompt included) reads the prefix rows: no hits at all.
    with Engine.from_pretrained(qwen2_dir) as engine:
        engine.embed(QUERIES[:1], prompt_name="query")
        got = engine.embed(QUERIES, prompt_name="query")
        assert _stats(engine)["prefix_hit_tokens"] == 0
    assert cosine(np.stack(got), st_embed(qwen2_dir, QUERIES, prompt_name="query")).min() >= FP32_MIN_COSINE


def test_cls_pooling_reads_position_zero_so_never_hits(llama_dir: Path) -> None:
    seqs = [[*random_ids(40, seed=5), i + 1] for i in range(3)]
    with Engine.from_pretrained(llama_dir) as engine:
        engine.embed(seqs[:1])
        got = engine.embed(seqs)
        assert _stats(engine)["prefix_hit_tokens"] == 0
    assert cosine(np.stack(got), hf_embed_ids(llama_dir, seqs, "cls", False)).min() >= FP32_MIN_COSINE


def test_bf16_hits_stay_within_bf16_rounding(qwen3_dir: Path) -> None:
    prefix = random_ids(80, seed=6)
    seqs = [prefix + random_ids(20, seed=600 + i) for i in range(8)]
    with Engine.from_pretrained(qwen3_dir, dtype="bfloat16", enable_prefix_caching=False) as off:
        cold = np.stack(off.embed(seqs))
    with Engine.from_pretrained(qwen3_dir, dtype="bfloat16") as engine:
        engine.embed([[*prefix, 3]])
        hot = np.stack(engine.embed(seqs))
        assert _stats(engine)["prefix_hit_tokens"] == 8 * 80
    assert np.quantile(cosine(hot, cold), 0.01) >= 0.999


def test_where_it_is_off_and_where_asking_for_it_is_refused(
    qwen3_dir: Path, qwen3_vl_dir: Path, tmp_path: Path
) -> None:
    from tests.helpers.tiny_rerankers import build_cross_encoder

    with Engine.from_pretrained(qwen3_dir, deterministic=True) as det:
        assert not det.config.cache.prefix_caching
    with pytest.raises(ModelLoadError, match="deterministic"):
        Engine.from_pretrained(qwen3_dir, deterministic=True, enable_prefix_caching=True)
    ce = build_cross_encoder(tmp_path / "ce", "bert")
    with Engine.from_pretrained(ce) as encoder:
        assert not encoder.config.cache.prefix_caching
    with pytest.raises(ModelLoadError, match="needs a decoder"):
        Engine.from_pretrained(ce, enable_prefix_caching=True)
    with pytest.raises(ModelLoadError, match="multimodal"):
        Engine.from_pretrained(qwen3_vl_dir, enable_prefix_caching=True)
    with Engine.from_pretrained(qwen3_dir) as on:
        assert on.config.cache.prefix_caching and on.config.cache.max_cached_blocks >= 1


def test_the_servers_warm_up_caches_the_models_prompts(qwen3_dir: Path) -> None:
    from tests.helpers.inprocess import runtime_of, server_client

    with server_client(qwen3_dir) as client:
        engine = runtime_of(client).engine
        assert engine is not None and engine.stats()["prefix_cached_blocks"] >= 1
        before = engine.stats()["prefix_hit_tokens"]
        resp = client.post("/v1/embeddings", json={"input": QUERIES[0], "prompt_name": "query"})
        assert resp.status_code == 200
        assert engine.stats()["prefix_hit_tokens"] - before >= 16  # the very first query hits
    ref = st_embed(qwen3_dir, QUERIES[:1], prompt_name="query")
    assert cosine(np.array([resp.json()["data"][0]["embedding"]]), ref).min() >= FP32_MIN_COSINE


def test_many_equal_short_hits_take_the_grouped_attention(qwen3_dir: Path) -> None:
    """Eight 36-token queries after a cached 16-token block: one step, their chunks grouped into
    one attention call per layer (attention/cpu_batched.py), against transformers."""
    prefix = random_ids(19, seed=8)
    seqs = [[*prefix, *random_ids(17, seed=800 + i)] for i in range(8)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    with Engine.from_pretrained(qwen3_dir) as engine:
        engine.embed([[*prefix, 1]])
        steps = _stats(engine)["steps"]
        got = np.stack(engine.embed(seqs))
        stats = _stats(engine)
    assert stats["steps"] == steps + 1 and stats["prefix_hit_tokens"] == 8 * 16
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
