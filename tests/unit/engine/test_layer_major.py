"""Layer-major prefill of long prompts (scheduler/lane.py, worker/lane_runner.py) vs the HF reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.builder import build_engine
from embedserve.errors import InternalEngineError, InvalidInputError, ModelLoadError
from embedserve.models.decoder import DecoderModel
from embedserve.pooling.head import apply_head
from embedserve.request import EmbedParams, Priority, Request
from embedserve.scheduler.policy import RESPONSIVE_WINDOW_S, BatchAllowance
from embedserve.worker.layer_major import GRANULE, LayerMajorJob, ladder_floor
from embedserve.worker.model_runner import kv_bytes_per_block
from tests.helpers.reference import cosine, hf_embed_ids, random_ids

FP32_MIN_COSINE = 0.99999


def _request(rid: int, ids: list[int], priority: Priority = Priority.ONLINE) -> Request:
    return Request(rid, ids, EmbedParams(normalize=True), PoolingMethod.LAST, priority)


def test_long_prompts_match_reference_and_skip_the_kv_cache(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n + 3) for n in (5, 99, 100, 700, 3001)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=64, layer_major_tokens=100) as engine:
        got = engine.embed(seqs)
        stats = engine.stats()
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    assert stats["layer_major_finished"] == 3  # 100, 700 and 3001 tokens; 5 and 99 were chunked
    assert stats["kv_blocks_used"] == 0


@pytest.mark.parametrize(
    ("fixture", "pooling", "normalize"), [("qwen2_dir", "mean", True), ("llama_dir", "cls", False)]
)
def test_mean_and_cls_pooling_through_the_lane(
    request: pytest.FixtureRequest, fixture: str, pooling: str, normalize: bool
) -> None:
    path: Path = request.getfixturevalue(fixture)
    seqs = [random_ids(n, seed=5 * n) for n in (40, 1000, 2100)]
    ref = hf_embed_ids(path, seqs, pooling=pooling, normalize=normalize)
    with Engine.from_pretrained(path, max_num_batched_tokens=256, layer_major_tokens=1) as engine:
        got = engine.embed(seqs)
        assert engine.stats()["layer_major_finished"] == 3
    assert cosine(got, ref).min() >= FP32_MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)


def test_bf16_lane_matches_fp32_reference(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n + 11) for n in (300, 4096)]
    ref = hf_embed_ids(qwen3_dir, seqs)
    with Engine.from_pretrained(
        qwen3_dir, dtype="bfloat16", max_num_batched_tokens=512, layer_major_tokens=1
    ) as engine:
        got = engine.embed(seqs)
    cos = cosine(got, ref)
    assert 0.999 <= cos.min() < 0.9999999, cos


def test_lane_equals_chunked_path_for_the_same_prompts(qwen3_dir: Path) -> None:
    seqs = [random_ids(n, seed=n) for n in (17, 600, 2048, 2500)]
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=128, layer_major_tokens=0) as engine:
        chunked = engine.embed(seqs)
        assert "layer_major_finished" not in engine.stats()  # 0 turns the lane off
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=128, layer_major_tokens=500) as engine:
        mixed = engine.embed(seqs)
    np.testing.assert_allclose(mixed, chunked, atol=2e-6)


def test_online_prompt_overtakes_a_started_batch_prompt(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=256, layer_major_tokens=1000).core
    lane = core.scheduler.lane
    assert lane is not None
    doc, query = _request(0, random_ids(3000, seed=1), Priority.BATCH), _request(1, random_ids(1200, seed=2))
    core.add(doc)
    assert core.step() == []
    assert lane.stats()["layer_major_started"] == 1
    core.add(query)
    stats = core.stats()  # what /metrics reports as running and waiting covers the lane too
    assert (stats["num_running"], stats["num_waiting"], stats["kv_blocks_used"]) == (1, 1, 0)
    finished: list[int] = []
    while core.has_work:
        finished += [f.request.request_id for f in core.step()]
    assert finished == [1, 0]  # the online prompt ran first; the paused document resumed after


def _online_step_took(allowance: BatchAllowance, seconds: float) -> None:
    """Online steps lately took `seconds` (the allowance's history of them replaced)."""
    allowance._online_steps.clear()
    allowance.observe(online=True, tokens=0, seconds=seconds)


def test_batch_prompt_waits_while_online_work_waits(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=256, layer_major_tokens=1000).core
    lane, runner = core.scheduler.lane, core.lane
    assert lane is not None and runner is not None
    core.add(_request(0, random_ids(2000, seed=3), Priority.BATCH))
    core.add(_request(1, random_ids(900, seed=4)))  # online, chunked: 256, 256, 256, 132
    for _ in range(3):
        assert core.step() == []
    assert not lane.started and lane.clock.ticks == 3  # untouched, but aging
    (fin,) = core.step()  # the online prompt's last chunk: answered without a lane slice
    assert fin.request.request_id == 1 and not lane.started
    _online_step_took(
        core.scheduler.allowance, 1e9
    )  # a slow online step: the lane's unit may be a whole chunk
    core.step()
    job = runner.jobs[0]
    assert job.tokens_left == lane.num_layers * 2000 - 256  # alone: one 256-token unit


def test_finished_requests_are_published_before_the_lane_slice(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=256, layer_major_tokens=1000).core
    lane, runner = core.scheduler.lane, core.lane
    assert lane is not None and runner is not None
    core.add(_request(0, random_ids(3000, seed=1)))  # an online document: the lane runs this step
    core.add(_request(1, random_ids(20, seed=2)))
    events: list[object] = []
    run = runner.run

    def step(req: Request, token_layers: int) -> bool:
        events.append("lane")
        return run(req, token_layers)

    runner.run = step  # type: ignore[method-assign]
    done = core.step(lambda fins: events.append([f.request.request_id for f in fins]))
    assert events == [[1], "lane"] and done == []  # the query was answered before the lane ran
    assert runner.jobs[0].tokens_left < lane.num_layers * 3000


def test_batch_prompt_ages_past_continuous_online_work(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=64, layer_major_tokens=1000).core
    lane, runner = core.scheduler.lane, core.lane
    assert lane is not None and runner is not None
    lane.clock.aging_steps = 3
    core.add(_request(0, random_ids(1000, seed=5), Priority.BATCH))
    core.add(_request(1, random_ids(640, seed=6)))  # ten steps of online work
    for _ in range(3):
        core.step()
    assert not lane.started
    core.step()  # aged into the online class: it runs beside the online prompt
    assert runner.jobs[0].tokens_left < lane.num_layers * 1000


def test_lane_units_shrink_to_the_online_step_time(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=256, layer_major_tokens=1000).core
    runner, sched = core.lane, core.scheduler
    assert runner is not None
    core.add(_request(0, random_ids(3000, seed=7), Priority.BATCH))
    core.step()  # no online traffic yet: whole chunks
    job = runner.jobs[0]
    assert (job.layer, job.pos) == (0, 256) and runner.flops_per_s is not None
    core.add(_request(1, random_ids(20, seed=8)))
    (fin,) = core.step()
    assert fin.request.request_id == 1 and sched.allowance.online_step_s is not None
    _online_step_took(sched.allowance, 1e-9)  # queries answered in no time: units of one row
    core.step()
    assert job.pos == 257
    _online_step_took(sched.allowance, 1e9)  # all the time in the world: up to the chunk boundary, no further
    core.step()
    assert job.pos == 512
    _online_step_took(sched.allowance, 1e-9)
    assert sched.allowance.last_online_s is not None
    sched.allowance.last_online_s -= RESPONSIVE_WINDOW_S + 1  # no online request lately: whole chunks again
    core.step()
    assert job.pos == 768


def test_unit_rows_follow_the_flop_model(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=128, layer_major_tokens=500).core
    assert core.lane is not None
    req = _request(0, random_ids(1000, seed=9))
    job = LayerMajorJob(core.lane.model, req, 512, torch.device("cpu"))
    cfg = core.lane.model.config
    assert job.flops_per_key == 4 * cfg.num_attention_heads * cfg.head_dim
    assert job.unit_flops(2) == 2 * job.flops_per_row + job.flops_per_key * (1 + 2)
    g = GRANULE
    for rows, under in ((g, g // 2), (3 * g, 2 * g), (512, 6 * g), (7 * g, 6 * g)):  # the granule ladder
        assert job.rows_within(job.unit_flops(rows)) == ladder_sized(rows)
        assert job.rows_within(job.unit_flops(rows) - 1) == under
    for rows in (1, 2, 8, 32):  # below a granule: powers of two
        assert job.rows_within(job.unit_flops(rows)) == rows
        assert job.rows_within(job.unit_flops(2 * rows) - 1) == rows
    assert job.rows_within(0) == 1  # at least one row
    budget = job.unit_flops(2 * g)
    job.run(512)  # later rows see more keys: the same FLOPs buy fewer rows
    assert job.pos == 512 and job.rows_within(job.unit_flops(2 * g)) == 2 * g
    assert job.rows_within(budget) < 2 * g
    assert job.rows_within(1e30) == 1000 - 512  # never past the end of the layer


def ladder_sized(rows: int) -> int:
    """The largest unit on the granule ladder (2^k or 3 * 2^k granules) <= rows, written out."""
    steps = sorted({m << k for m in (1, 3) for k in range(20)})
    return GRANULE * max(s for s in steps if s * GRANULE <= rows)


def test_the_granule_ladder_is_two_significant_bits() -> None:
    assert [ladder_floor(n) for n in range(1, 26)] == [
        1, 2, 3, 4, 4, 6, 6, 8, 8, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 16, 16, 16, 16, 24, 24,
    ]  # fmt: skip
    for n in range(1, 5000):
        assert ladder_floor(n) * GRANULE == ladder_sized(n * GRANULE) and 3 * ladder_floor(n) > 2 * n


def _unit_is_aligned(start: int, end: int, chunk: int, length: int) -> bool:
    """Ends at the chunk boundary (or the prompt's end), or a size on the granule ladder from
    a granule, or a power of two below a granule starting on a multiple of itself."""
    size = end - start
    if end == min(length, (start // chunk + 1) * chunk):
        return True
    if start % GRANULE == 0 and size >= GRANULE and size == ladder_sized(size):
        return True
    return size < GRANULE and size & (size - 1) == 0 and start % size == 0


@pytest.mark.parametrize(("length", "chunk"), [(700, 256), (120, 100)])
def test_units_keep_to_granules_and_chunk_boundaries(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, length: int, chunk: int
) -> None:
    """Slices of any size cut units that never cross a chunk boundary and stay on the granule
    or a power of two (each new unit size or key count costs a oneDNN kernel kept for good);
    the vector is the one whole chunks give."""
    ids = random_ids(length, seed=10)
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=chunk, layer_major_tokens=1) as engine:
        (want,) = engine.embed([ids])
    core = build_engine(qwen3_dir, max_num_batched_tokens=chunk, layer_major_tokens=1).core
    assert core.lane is not None
    req = _request(0, ids)
    job = LayerMajorJob(core.lane.model, req, chunk, torch.device("cpu"))
    units: list[tuple[int, int]] = []
    run_layer = job.model.run_layer

    def record(
        index: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv: torch.Tensor,
        start: int,
        keep: slice | None,
        piece: int | None = None,
    ) -> torch.Tensor:
        units.append((start, start + x.shape[0]))
        return run_layer(index, x, positions, kv, start, keep, piece)

    monkeypatch.setattr(job.model, "run_layer", record)
    rng = np.random.default_rng(0)
    while not job.done:
        asked = int(rng.integers(1, 150))
        assert 1 <= job.run(asked) <= max(asked, 1)
    for start, n, rows in job.pooled_rows():
        job.request.pooling.update(start, n, rows)
    for start, end in units:
        assert start // chunk == (end - 1) // chunk, (start, end)  # inside one chunk
        assert _unit_is_aligned(start, end, chunk, length), (start, end)
    assert any(end - start < GRANULE and end % chunk for start, end in units)  # cuts below a granule
    got = apply_head(req.pooling.finish(), None, True)
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_small_slices_at_the_prompt_tail_stay_inside_it(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=256, layer_major_tokens=1).core
    assert core.lane is not None
    job = LayerMajorJob(core.lane.model, _request(0, random_ids(700, seed=11)), 256, torch.device("cpu"))
    assert job.run(640) == 512  # two whole chunks; 128 more would not reach the boundary
    assert job.run(128) == 128 and job.pos == 640
    assert job.run(10) == 8 and job.pos == 648  # a power of two, 640 + 8 still inside 700
    assert job.run(20) == 8 and job.pos == 656  # 648 is a multiple of 8, not of 16
    assert job.run(20) == 16 and job.pos == 672  # 656 is a multiple of 16
    assert job.run(28) == 28 and (job.layer, job.pos) == (1, 0)  # to the prompt's end, 700


def test_aborted_prompt_frees_the_lane(qwen3_dir: Path) -> None:
    core = build_engine(qwen3_dir, max_num_batched_tokens=128, layer_major_tokens=500).core
    core.add(_request(0, random_ids(2000, seed=5)))
    core.step()
    core.abort(0)
    assert not core.has_work and core.stats()["layer_major_started"] == 0
    core.add(_request(1, random_ids(600, seed=6)))
    out: list[np.ndarray] = []
    while core.has_work:
        out += [f.vector.numpy() for f in core.step() if f.vector is not None]
    ref = hf_embed_ids(qwen3_dir, [random_ids(600, seed=6)])
    assert cosine(np.stack(out), ref).min() >= FP32_MIN_COSINE


def test_failed_forward_fails_that_prompt_only(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Engine.from_pretrained(qwen3_dir, max_num_batched_tokens=128, layer_major_tokens=500) as engine:
        real = DecoderModel.run_layer

        def broken(self: DecoderModel, index: int, x: torch.Tensor, *args: object) -> torch.Tensor:
            if x.shape[0] == 128 and index == 1:
                raise RuntimeError("simulated kernel failure")
            return real(self, index, x, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(DecoderModel, "run_layer", broken)
        with pytest.raises(InternalEngineError, match="simulated kernel failure"):
            engine.embed([random_ids(1000, seed=7)])
        monkeypatch.setattr(DecoderModel, "run_layer", real)
        got = engine.embed([random_ids(700, seed=8), random_ids(20, seed=9)])
        assert engine.stats()["layer_major_started"] == 0
    ref = hf_embed_ids(qwen3_dir, [random_ids(700, seed=8), random_ids(20, seed=9)])
    assert cosine(got, ref).min() >= FP32_MIN_COSINE


def test_lane_prompts_need_no_kv_room_but_respect_max_model_len(qwen3_dir: Path) -> None:
    block_bytes = kv_bytes_per_block(build_engine(qwen3_dir).config.model, 16, torch.float32)
    with Engine.from_pretrained(
        qwen3_dir, max_model_len=3000, kv_cache_memory=40 * block_bytes, layer_major_tokens=1000
    ) as engine:
        with pytest.raises(InvalidInputError, match="exceed the whole KV cache"):
            engine.embed([random_ids(900, seed=1)])  # chunked path: 900 tokens > 640 cached
        got = engine.embed([random_ids(2900, seed=2)])  # lane: no KV blocks at all
        with pytest.raises(InvalidInputError, match="3001 tokens exceed the limit of 3000"):
            engine.embed([random_ids(3001, seed=3)])
    assert cosine(got, hf_embed_ids(qwen3_dir, [random_ids(2900, seed=2)]))[0] >= FP32_MIN_COSINE


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8192"])
def test_bad_threshold_is_refused(qwen3_dir: Path, bad: object) -> None:
    with pytest.raises(ModelLoadError, match="layer_major_tokens must be an integer"):
        build_engine(qwen3_dir, layer_major_tokens=bad)  # type: ignore[arg-type]


def test_default_threshold_on_cpu(qwen3_dir: Path) -> None:
    assert build_engine(qwen3_dir).config.scheduler.layer_major_tokens == 4096
    big = build_engine(qwen3_dir, max_num_batched_tokens=8192).config.scheduler
    assert big.layer_major_tokens == 16384  # never below two token budgets
