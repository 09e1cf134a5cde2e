"""Scheduler policy without a model: budgets, chunking, classes, aging, preemption."""

from __future__ import annotations

import pytest
import torch

from embedserve.config import PoolingMethod, SchedulerConfig
from embedserve.errors import InvalidInputError
from embedserve.kv_cache.manager import KVCacheManager
from embedserve.request import EmbedParams, Priority, Request, RequestStatus
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput
from embedserve.scheduler.policy import LULL_STEP_S, RESPONSIVE_WINDOW_S
from embedserve.scheduler.scheduler import Scheduler


def make(num_blocks: int = 64, block_size: int = 4, **cfg: int) -> Scheduler:
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(num_blocks, block_size))


def req(rid: int, n: int, priority: Priority = Priority.ONLINE) -> Request:
    return Request(rid, list(range(n)), EmbedParams(), PoolingMethod.MEAN, priority)


def complete(s: Scheduler, out: SchedulerOutput, reqs: dict[int, Request]) -> list[Request]:
    for c in out.chunks:  # the engine folds the pooled rows (engine/core.py), then the scheduler advances
        r = reqs[c.request_id]
        if r.status is RequestStatus.RUNNING:
            r.pooling.update(c.start, c.num_tokens, torch.ones(c.pool_rows[1] - c.pool_rows[0], 2))
    return s.update_from_output(out, reqs)


def run_to_end(s: Scheduler, reqs: dict[int, Request], limit: int = 10_000) -> list[int]:
    order = []
    for _ in range(limit):
        if not s.has_work:
            return order
        order += [r.request_id for r in complete(s, s.schedule(), reqs)]
    raise AssertionError("scheduler did not finish: livelock")


def test_budget_chunks_long_prompts_and_packs_others() -> None:
    s = make(max_num_batched_tokens=8, max_model_len=64)
    a, b = req(1, 20), req(2, 3)
    for r in (a, b):
        s.add_request(r)
    out = s.schedule()
    assert [(c.request_id, c.start, c.num_tokens) for c in out.chunks] == [(1, 0, 8)]
    complete(s, out, {1: a, 2: b})
    out = s.schedule()
    assert [(c.request_id, c.start, c.num_tokens) for c in out.chunks] == [(1, 8, 8)]
    complete(s, out, {1: a, 2: b})
    out = s.schedule()  # 4 left of a, then b fills the rest of the budget
    assert [(c.request_id, c.start, c.num_tokens) for c in out.chunks] == [(1, 16, 4), (2, 0, 3)]
    assert out.num_tokens <= 8


def test_online_goes_before_earlier_batch_until_batch_ages() -> None:
    s = make(max_num_batched_tokens=4, max_model_len=64, batch_aging_steps=3)
    batch, online = req(1, 4, Priority.BATCH), req(2, 4)
    s.add_request(batch)
    s.add_request(online)
    assert [c.request_id for c in s.schedule().chunks] == [2]
    # A stream of online work cannot starve the batch request past the aging bound.
    reqs = {1: batch, 2: online}
    seen_batch_at = None
    for step in range(10):
        new = req(100 + step, 4)
        s.add_request(new)
        reqs[new.request_id] = new
        out = s.schedule()
        if any(c.request_id == 1 for c in out.chunks):
            seen_batch_at = step
            break
        complete(s, out, reqs)
    assert seen_batch_at is not None and seen_batch_at <= 3


def test_preempts_lowest_priority_and_resets_it() -> None:
    # 4 blocks of 4 tokens. A batch request fills 3 blocks, then online work needs 2.
    s = make(num_blocks=4, max_num_batched_tokens=12, max_model_len=16)
    batch = req(1, 16, Priority.BATCH)
    s.add_request(batch)
    out = s.schedule()
    complete(s, out, {1: batch})
    assert batch.num_computed_tokens == 12 and batch.pooling.num_pooled_tokens == 12
    online = req(2, 8)
    s.add_request(online)
    out = s.schedule()
    assert out.preempted_ids == [1]
    assert next(c.request_id for c in out.chunks) == 2
    assert batch.status is RequestStatus.WAITING
    assert batch.num_computed_tokens == 0 and batch.pooling.num_pooled_tokens == 0
    assert batch.num_preemptions == 1 and s.num_preemptions == 1
    assert s.kv.block_table(1) == []
    assert run_to_end(s, {1: batch, 2: online}) in ([2, 1], [1])


def test_many_requests_under_tiny_cache_all_finish() -> None:
    # Requests keep arriving while the cache is full; online ones preempt batch ones.
    s = make(num_blocks=8, max_num_batched_tokens=6, max_model_len=32)
    lengths = [30, 5, 17, 32, 1, 9, 28, 3, 31, 12]
    reqs = {i: req(i, n, Priority.ONLINE if i % 3 == 2 else Priority.BATCH) for i, n in enumerate(lengths)}
    finished: list[int] = []
    for r in reqs.values():
        s.add_request(r)
        finished += [f.request_id for f in complete(s, s.schedule(), reqs)]
    finished += run_to_end(s, reqs)
    assert sorted(finished) == sorted(reqs)
    assert s.num_preemptions > 0
    assert s.kv.pool.num_free == 8
    for r in reqs.values():
        assert r.status is RequestStatus.FINISHED and r.pooling.num_pooled_tokens == r.num_prompt_tokens


def test_max_num_seqs_bounds_requests_in_flight() -> None:
    s = make(max_num_batched_tokens=100, max_num_seqs=2, max_model_len=64)
    for i in range(4):
        s.add_request(req(i, 10))
    out = s.schedule()
    assert len(out.chunks) == 2 and len(s.running) == 2


def test_unchunkable_prompt_waits_for_a_step_with_room() -> None:
    s = make(max_num_batched_tokens=10, max_model_len=10, allow_chunking=False)
    a, b = req(1, 6), req(2, 6)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(1, 6)]


def test_requests_that_can_never_run_are_refused_on_admission() -> None:
    s = make(num_blocks=2, block_size=4, max_model_len=100)
    with pytest.raises(InvalidInputError, match="exceed the whole KV cache"):
        s.add_request(req(1, 9))
    with pytest.raises(InvalidInputError, match="exceed max_model_len"):
        s.add_request(req(2, 101))
    with pytest.raises(InvalidInputError, match="empty"):
        s.add_request(req(3, 0))
    assert not s.has_work


def test_abort_frees_blocks() -> None:
    s = make()
    r = req(1, 10)
    s.add_request(r)
    s.schedule()
    assert s.kv.pool.num_used > 0
    s.abort(r)
    assert s.kv.pool.num_used == 0 and not s.has_work and r.status is RequestStatus.ABORTED


def test_batch_shares_only_a_small_part_of_steps_that_carry_online_work() -> None:
    s = make(max_num_batched_tokens=64, max_model_len=256, batch_tokens_with_online=8)
    doc = req(1, 200, Priority.BATCH)
    s.add_request(doc)
    reqs = {1: doc}
    out = s.schedule()  # batch alone: the whole budget
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(1, 64)]
    complete(s, out, reqs)
    query = req(2, 5)
    s.add_request(query)
    reqs[2] = query
    out = s.schedule()  # the online query's step: batch capped, so the step stays short
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(2, 5), (1, 8)]
    complete(s, out, reqs)
    out = s.schedule()  # online work done: full budget again
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(1, 64)]


def _recent_online(s: Scheduler, reqs: dict[int, Request], batch_first: int) -> None:
    """A batch step at 1,000 tokens/s, then an online query's step of 30 ms."""
    out = s.schedule()
    assert [c.num_tokens for c in out.chunks] == [batch_first]
    s.observe(out, batch_first / 1000)
    complete(s, out, reqs)
    reqs[2] = req(2, 4)
    s.add_request(reqs[2])
    out = s.schedule()
    assert out.online and out.chunks[0].request_id == 2
    s.observe(out, 0.030)
    complete(s, out, reqs)


def test_batch_steps_stay_short_while_online_requests_come() -> None:
    s = make(max_num_batched_tokens=64, max_model_len=256, batch_tokens_with_online=32)
    reqs = {1: req(1, 200, Priority.BATCH)}
    s.add_request(reqs[1])
    _recent_online(s, reqs, 64)
    # About half an online step at the measured rate (~1,000 tokens/s): 15 tokens, not 64.
    rate = s.allowance.tokens_per_s
    assert rate is not None and 900 < rate < 1100
    out = s.schedule()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(1, int(0.5 * 0.030 * rate))]
    complete(s, out, reqs)
    s.allowance.last_online_s -= RESPONSIVE_WINDOW_S + 1  # no online request lately
    out = s.schedule()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(1, 64)]


def test_after_a_lull_a_batch_step_is_bounded_in_time_not_only_by_the_budget() -> None:
    """No online request lately: batch steps take the budget, but no more than LULL_STEP_S at the
    rate steps ran at, so the first online request after a lull waits that long at most."""
    s = make(num_blocks=1024, max_num_batched_tokens=2048, max_model_len=4096)
    reqs = {1: req(1, 4000, Priority.BATCH)}
    s.add_request(reqs[1])
    out = s.schedule()  # nothing timed yet: the budget
    assert [c.num_tokens for c in out.chunks] == [2048]
    s.observe(out, 2048 / 400)  # 400 tokens/s: a slow model on a small CPU
    complete(s, out, reqs)
    out = s.schedule()
    assert [c.num_tokens for c in out.chunks] == [int(LULL_STEP_S * 400)]


def test_an_online_step_carries_a_tenth_of_its_time_in_batch_tokens() -> None:
    s = make(max_num_batched_tokens=64, max_model_len=256, batch_tokens_with_online=32)
    reqs = {1: req(1, 200, Priority.BATCH)}
    s.add_request(reqs[1])
    _recent_online(s, reqs, 64)
    reqs[5] = req(5, 4)
    s.add_request(reqs[5])
    rate = s.allowance.tokens_per_s
    assert rate is not None
    out = s.schedule()  # 10% of a 30 ms online step at ~1,000 tokens/s: 3 batch tokens beside it
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(5, 4), (1, int(0.1 * 0.030 * rate))]


def test_an_encoders_batch_prompt_still_runs_whole_between_online_queries() -> None:
    s = make(max_num_batched_tokens=64, max_model_len=64, batch_tokens_with_online=32, allow_chunking=False)
    reqs = {1: req(1, 40, Priority.BATCH), 3: req(3, 40, Priority.BATCH)}
    s.add_request(reqs[1])
    s.add_request(reqs[3])
    _recent_online(s, reqs, 40)
    out = s.schedule()  # 16 tokens allowed, and it cannot be cut: it runs alone, whole
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(3, 40)]


def test_deterministic_batch_chunks_never_go_below_their_unit() -> None:
    s = make(
        max_num_batched_tokens=64, max_model_len=256, batch_tokens_with_online=32, deterministic_chunk=32
    )
    reqs = {1: req(1, 200, Priority.BATCH)}
    s.add_request(reqs[1])
    _recent_online(s, reqs, 64)
    out = s.schedule()  # 16 tokens allowed: one 32-token chunk rather than none
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [(1, 32)]


def test_a_batch_request_ages_while_it_waits_not_while_it_advances() -> None:
    s = make(num_blocks=512, max_num_batched_tokens=64, max_model_len=2048, batch_aging_steps=4)
    reqs = {1: req(1, 1000, Priority.BATCH)}
    s.add_request(reqs[1])
    for _ in range(10):  # short steps, many more than batch_aging_steps: still batch work
        out = s.schedule()
        assert [c.request_id for c in out.chunks] == [1]
        complete(s, out, reqs)
        assert not s.clock.is_online(reqs[1])
    for i in range(2, 12):  # online queries that fill every step's budget from now on
        reqs[i] = req(i, 64)
        s.add_request(reqs[i])
    steps = [[c.request_id for c in complete_step(s, reqs)] for _ in range(8)]
    # Three steps without work, then it ran as online work (aged: the 4th tick), and its age
    # started again from there: three more without work, then again.
    assert steps == [[2], [3], [4], [1], [5], [6], [7], [1]]


def complete_step(s: Scheduler, reqs: dict[int, Request]) -> list[ScheduledChunk]:
    out = s.schedule()
    complete(s, out, reqs)
    return out.chunks


def test_batch_requests_behind_their_own_class_do_not_age_into_online_work() -> None:
    """A window of batch requests fed a few tokens a step beside online queries: the ones waiting
    behind the first do not age into the online class (they would then run whole steps as
    online work, the steps the queries wait behind), while batch work as a whole progresses."""
    s = make(num_blocks=512, max_num_batched_tokens=64, max_model_len=2048, batch_aging_steps=4)
    reqs = {i: req(i, 400, Priority.BATCH) for i in (1, 2, 3)}
    for r in reqs.values():
        s.add_request(r)
    for step in range(12):  # an online query every step: batch gets what is left beside it
        reqs[100 + step] = req(100 + step, 60)
        s.add_request(reqs[100 + step])
        out = s.schedule()
        complete(s, out, reqs)
        assert not any(s.clock.is_online(reqs[i]) for i in (2, 3)), step
        assert any(c.request_id == 1 for c in out.chunks)  # the first batch request advances


def test_one_long_online_step_does_not_size_the_batch_steps_after_it() -> None:
    """An online step's time is the median of the last ones: a warm-up's 2 s step among 30 ms
    steps leaves batch steps sized by the 30 ms."""
    s = make(max_num_batched_tokens=64, max_model_len=256, batch_tokens_with_online=64)
    allowance = s.allowance
    allowance.observe(False, 1000, 1.0)  # 1,000 tokens/s
    for seconds in (2.0, 0.03, 0.03):
        allowance.observe(True, 0, seconds)
    assert allowance.online_step_s == 0.03
    assert allowance.tokens(online_queued=False) == int(0.5 * 0.03 * allowance.tokens_per_s)
