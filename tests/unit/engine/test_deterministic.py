"""Deterministic mode: the same input gives the same float32 bytes whatever else is batched
with it, the token budget, preemption, and the path (layer-major lane or KV cache)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedserve import Engine
from embedserve.attention.metadata import pieces
from embedserve.config import PoolingMethod, SchedulerConfig
from embedserve.engine.builder import build_engine
from embedserve.engine.resolve import DETERMINISTIC_CHUNK
from embedserve.kv_cache.manager import KVCacheManager
from embedserve.pooling.state import PoolingState
from embedserve.request import EmbedParams, Priority, Request
from embedserve.scheduler.scheduler import Scheduler
from embedserve.schema import ModelMetadata
from embedserve.worker.model_runner import kv_bytes_per_block
from tests.helpers.reference import random_ids
from tests.helpers.tiny_bert import build_encoder

log = logging.getLogger(__name__)

LENGTHS = [1, 2, 17, 63, 64, 65, 255, 256, 257, 300, 511, 700, 1000, 1500, 2047, 2049, 3000, 4100, 6000, 9000]
INPUTS = [random_ids(n, seed=i) for i, n in enumerate(LENGTHS)]
OTHERS = [
    random_ids(int(n), seed=100 + i) for i, n in enumerate(np.random.default_rng(1).integers(1, 3000, 40))
]


def _bytes(vectors: np.ndarray) -> list[bytes]:
    return [np.ascontiguousarray(v, dtype=np.float32).tobytes() for v in vectors]


def _embed(
    path: Path, dtype: str, deterministic: bool, together: bool, **options: object
) -> tuple[list[bytes], dict[str, int]]:
    """INPUTS' vectors (each alone, or shuffled among OTHERS in one call) and engine stats."""
    with Engine.from_pretrained(path, dtype=dtype, deterministic=deterministic, **options) as engine:
        if not together:
            vectors = np.stack([engine.embed([x])[0] for x in INPUTS])
        else:
            batch = INPUTS + OTHERS
            order = np.random.default_rng(7).permutation(len(batch))
            out = engine.embed([batch[i] for i in order])
            back = {int(i): out[k] for k, i in enumerate(order)}
            vectors = np.stack([back[i] for i in range(len(INPUTS))])
        return _bytes(vectors), engine.stats()


def _preempted(path: Path, dtype: str) -> list[bytes]:
    """INPUTS as batch work in a KV cache that holds the longest of them and little more; once
    the longest is part-way, OTHERS arrive online and take its blocks (recompute preemption)."""
    per_block = kv_bytes_per_block(build_engine(path).config.model, 16, getattr(torch, dtype))
    kv = (max(LENGTHS) // 16 + 8) * per_block
    parts = build_engine(
        path,
        dtype=dtype,
        deterministic=True,
        max_num_batched_tokens=1024,
        layer_major_tokens=0,
        kv_cache_memory=kv,
    )
    core, cfg = parts.core, parts.config

    def request(rid: int, ids: list[int], priority: Priority) -> Request:
        params = EmbedParams(normalize=True)
        return Request(
            rid,
            ids,
            params,
            cfg.pooling.method,
            priority,
            deterministic_chunk=cfg.scheduler.deterministic_chunk,
        )

    longest = request(len(INPUTS) - 1, INPUTS[-1], Priority.BATCH)
    for i, ids in enumerate(INPUTS[:-1]):
        core.add(request(i, ids, Priority.BATCH))
    core.add(longest)
    done = {}
    while longest.num_computed_tokens < 8192:  # it holds nearly the whole cache
        done.update({f.request.request_id: f.vector for f in core.step()})
    for i, ids in enumerate(OTHERS):
        core.add(request(1000 + i, ids, Priority.ONLINE))
    while core.has_work:
        done.update({f.request.request_id: f.vector for f in core.step()})
    assert longest.num_preemptions > 0  # the case does preempt
    return _bytes(np.stack([done[i].numpy() for i in range(len(INPUTS))]))


CASES: dict[str, tuple[bool, dict[str, object]]] = {
    "batched, budget 256": (True, {"max_num_batched_tokens": 256, "layer_major_tokens": 0}),
    "batched, budget 512": (True, {"max_num_batched_tokens": 512, "layer_major_tokens": 0}),
    "batched, budget 8192": (True, {"max_num_batched_tokens": 8192, "layer_major_tokens": 0}),
    "alone, lane": (False, {"max_num_batched_tokens": 512, "layer_major_tokens": 1}),
    "batched, lane from 1,000 tokens": (True, {"max_num_batched_tokens": 2048, "layer_major_tokens": 1000}),
}


# CI time: fp32 runs the smallest budget, a lane beside batched prompts and preemption in CI; the
# other cases and bf16 with `-m slow`
_IN_CI = ("batched, budget 256", "batched, lane from 1,000 tokens", "preempted")
_ALL = (*CASES, "preempted")


@pytest.mark.parametrize(
    ("dtype", "names"),
    [
        ("float32", _IN_CI),
        pytest.param("float32", tuple(n for n in _ALL if n not in _IN_CI), marks=pytest.mark.slow),
        pytest.param("bfloat16", _ALL, marks=pytest.mark.slow),
    ],
    ids=["float32", "float32-rest", "bfloat16"],
)
def test_vectors_are_byte_identical_across_batches_budgets_paths_and_preemption(
    qwen3_dir: Path, dtype: str, names: tuple[str, ...]
) -> None:
    base, _ = _embed(qwen3_dir, dtype, True, False, max_num_batched_tokens=2048, layer_major_tokens=0)
    for name in names:
        if name == "preempted":
            got = _preempted(qwen3_dir, dtype)
        else:
            together, options = CASES[name]
            got, stats = _embed(qwen3_dir, dtype, True, together, **options)
            assert stats.get("layer_major_finished", 0) > 0 or "lane" not in name
        differ = [n for n, a, b in zip(LENGTHS, base, got, strict=True) if a != b]
        assert not differ, f"{dtype}, {name}: bytes differ at lengths {differ}"


@pytest.mark.slow  # CI time (2026-12-07): its area keeps a representative in CI
def test_without_the_flag_some_case_differs(qwen3_dir: Path) -> None:
    """What the mode buys: the default engine's bytes move with the budget and the batch (so
    the test above could fail)."""
    base, _ = _embed(qwen3_dir, "float32", False, False, max_num_batched_tokens=2048, layer_major_tokens=0)
    differing = 0
    for name, (together, options) in CASES.items():
        got, _ = _embed(qwen3_dir, "float32", False, together, **options)
        differ = [n for n, a, b in zip(LENGTHS, base, got, strict=True) if a != b]
        log.warning("default mode, %s: bytes differ at lengths %s", name, differ)
        differing += len(differ)
    assert differing > 0


def test_metadata_names_the_mode(qwen3_dir: Path) -> None:
    plain, det = (build_engine(qwen3_dir, deterministic=d).config for d in (False, True))
    assert (
        det.scheduler.deterministic_chunk == DETERMINISTIC_CHUNK
        and plain.scheduler.deterministic_chunk is None
    )
    metas = [ModelMetadata.from_engine_config(c, "m", None, "fp") for c in (plain, det)]
    assert (metas[0].backend_profile, metas[1].backend_profile) == ("cpu-fp32", "cpu-fp32-det")
    assert metas[0].schema() == metas[1].schema()  # the same vector space


def test_an_encoder_is_deterministic_and_says_so(tmp_path: Path) -> None:
    """Encoders run every input whole in one attention call: the flag changes the profile only."""
    path = build_encoder(tmp_path / "bert", "bert", pooling="mean", normalize=True)
    texts = [f"text number {i} " * (i + 1) for i in range(12)]
    with Engine.from_pretrained(path, deterministic=True) as engine:
        alone = _bytes(np.stack([engine.embed([t])[0] for t in texts[:3]]))
        batched = _bytes(engine.embed(texts[::-1]))[::-1][:3]
        assert engine.config.deterministic and engine.config.scheduler.deterministic_chunk is None
    assert alone == batched
    meta = ModelMetadata.from_engine_config(build_engine(path, deterministic=True).config, "m", None, "fp")
    assert meta.backend_profile == "cpu-fp32-det"


def test_a_budget_below_the_chunk_is_refused(qwen3_dir: Path) -> None:
    from embedserve.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"multiples of 256 tokens.*max_num_batched_tokens \(128\)"):
        build_engine(qwen3_dir, deterministic=True, max_num_batched_tokens=128)


def test_pieces_cut_at_multiples() -> None:
    assert pieces(0, 600, 256) == [(0, 256), (256, 256), (512, 88)]
    assert pieces(512, 300, 256) == [(512, 256), (768, 44)]
    assert pieces(5, 10, None) == [(5, 10)]


def test_scheduler_cuts_chunks_on_the_grid_whatever_the_leftover_budget() -> None:
    cfg = SchedulerConfig(max_num_batched_tokens=512, max_model_len=4096, deterministic_chunk=256)
    s = Scheduler(cfg, KVCacheManager(1024, 16))
    reqs = [
        Request(i, list(range(n)), EmbedParams(), PoolingMethod.MEAN) for i, n in enumerate([100, 700, 300])
    ]
    for r in reqs:
        s.add_request(r)
    out = s.schedule()  # 100 fits whole; 412 left: 700 gets 256 (not 412); 300 would need 256 of 156
    assert [(c.request_id, c.start, c.num_tokens) for c in out.chunks] == [(0, 0, 100), (1, 0, 256)]


def test_mean_pooling_folds_fixed_blocks_whatever_the_chunks() -> None:
    rows = torch.randn(700, 8) * torch.logspace(0, 6, 700)[:, None]  # sums that round differently
    states = []
    for cuts in ([0, 700], [0, 256, 512, 700], [0, 512, 700]):
        state = PoolingState(PoolingMethod.MEAN, 700, excluded_prefix=3, deterministic_chunk=256)
        for lo, hi in itertools.pairwise(cuts):
            a, b = state.rows(lo, hi - lo)
            state.update(lo, hi - lo, rows[lo + a : lo + b])
        states.append(state.finish().numpy().tobytes())
    assert states[0] == states[1] == states[2]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(OTHERS) - 1), max_size=12),
    budget=st.sampled_from([256, 512, 768, 2048]),
    lane=st.sampled_from([0, 1, 600]),
)
@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
def test_random_batches_and_budgets_give_the_same_bytes(
    qwen3_dir: Path, picks: list[int], budget: int, lane: int
) -> None:
    probe = INPUTS[::4]  # lengths 1, 64, 300, 1500, 6000
    with Engine.from_pretrained(qwen3_dir, deterministic=True, max_num_batched_tokens=2048) as engine:
        want = _bytes(engine.embed(probe))
    with Engine.from_pretrained(
        qwen3_dir, deterministic=True, max_num_batched_tokens=budget, layer_major_tokens=lane
    ) as engine:
        got = _bytes(engine.embed([OTHERS[i] for i in picks] + probe))[len(picks) :]
    assert got == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_bytes_do_not_move_with_the_thread_count(dtype: torch.dtype) -> None:
    """Deterministic mode's final pieces of 1-3 queries after 256+ cached keys: PyTorch's flash
    kernel splits their keys over its threads (a vector embedded in a process whose thread count
    another component changed came out other bytes); the invariant route does not."""
    from embedserve.attention.cpu import causal_attention
    from embedserve.kernels import flash_attention as native_flash

    if not native_flash.available(dtype):
        pytest.skip(f"no native flash kernel for {dtype} here: the route falls back to PyTorch's")
    gen = torch.Generator().manual_seed(0)
    before = torch.get_num_threads()
    try:
        for n, start in [(1, 256), (1, 2048), (2, 256), (3, 512), (15, 256)]:
            q = torch.randn(n, 4, 32, generator=gen).to(dtype)
            k, v = (torch.randn(2, start + n, 32, generator=gen).to(dtype) for _ in range(2))
            outs = []
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                outs.append(causal_attention(q, k, v, 0.25, invariant=True).view(torch.uint8))
            assert all(torch.equal(outs[0], o) for o in outs[1:]), (n, start)
    finally:
        torch.set_num_threads(before)
