"""Continuous batching for embeddings under a per-step token budget.

Every request orders by key = (class, arrival): `online` before `batch` (a batch request
that waited `batch_aging_steps` steps counts as online), then first come, first served.
Each step walks requests in key order and gives each the largest chunk that the budget and
the KV cache allow; while online work is queued, batch requests share only a small part of
the step (`batch_tokens_with_online`), so an online query never rides in a long step.
A request may take blocks from requests with a *larger* key (preemption by recompute).
The smallest key can take every block and admission guaranteed its prompt fits the whole
cache, so it always advances: nothing livelocks and nothing starves.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from embedserve.config import SchedulerConfig
from embedserve.errors import InvalidInputError
from embedserve.kv_cache.manager import KVCacheManager, blocks_for
from embedserve.request import Priority, Request, RequestStatus
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.step_count = 0
        self.num_preemptions = 0
        self._next_seq = 0

    # ---- admission -------------------------------------------------------------------------

    def check_admissible(self, num_tokens: int) -> None:
        """Raise if a prompt of this length could never run."""
        if num_tokens < 1:
            raise InvalidInputError("input is empty: it has no tokens")
        if num_tokens > self.config.max_model_len:
            raise InvalidInputError(f"{num_tokens} tokens exceed max_model_len ({self.config.max_model_len})")
        if blocks_for(num_tokens, self.kv.block_size) > self.kv.num_blocks:
            raise InvalidInputError(
                f"{num_tokens} tokens exceed the whole KV cache ({self.kv.max_tokens} tokens); "
                "raise kv_cache_memory"
            )

    def add_request(self, req: Request) -> None:
        self.check_admissible(req.num_prompt_tokens)
        req.arrival_seq = self._next_seq
        req.arrival_step = self.step_count
        self._next_seq += 1
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        req.status = RequestStatus.ABORTED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def has_online_work(self) -> bool:
        """Any request left that schedules as online (including aged batch requests)."""
        return any(self._key(r)[0] == 0 for r in self.running + self.waiting)

    # ---- one step --------------------------------------------------------------------------

    def _key(self, req: Request) -> tuple[int, int]:
        aged = self.step_count - req.arrival_step >= self.config.batch_aging_steps
        klass = 0 if req.priority is Priority.ONLINE or aged else 1
        return klass, req.arrival_seq

    def schedule(self) -> SchedulerOutput:
        self.step_count += 1
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[int] = []
        scheduled: set[int] = set()
        candidates = sorted(self.running + self.waiting, key=self._key)
        online_queued = any(self._key(r)[0] == 0 for r in candidates)
        batch_left = self.config.batch_cap_with_online if online_queued else budget
        for req in candidates:
            if budget == 0:
                break
            is_batch = self._key(req)[0] == 1
            if req.request_id in preempted:
                continue  # just lost its blocks to a more urgent request; retry next step
            if req.status is RequestStatus.WAITING and len(self.running) >= self.config.max_num_seqs:
                continue
            n = self._fit(req, min(budget, batch_left) if is_batch else budget, scheduled)
            if n == 0:
                continue
            preempted += self._make_room(req, n, scheduled)
            table = self.kv.allocate_slots(req.request_id, req.num_computed_tokens, n)
            assert table is not None, "_fit promised room that _make_room did not free"
            if req.status is RequestStatus.WAITING:
                self.waiting.remove(req)
                self.running.append(req)
                req.status = RequestStatus.RUNNING
            start = req.num_computed_tokens
            chunks.append(
                ScheduledChunk(
                    request_id=req.request_id,
                    start=start,
                    token_ids=req.token_ids[start : start + n],
                    block_table=list(table),
                    pool_rows=req.pooling.rows(start, n),
                )
            )
            scheduled.add(req.request_id)
            budget -= n
            if is_batch:
                batch_left -= n
        return SchedulerOutput(step=self.step_count, chunks=chunks, preempted_ids=preempted)

    def _victims(self, req: Request, scheduled: set[int]) -> list[Request]:
        """Requests `req` may preempt, cheapest loss first (largest key first)."""
        key = self._key(req)
        found = [
            r for r in self.running if r.request_id not in scheduled and r is not req and self._key(r) > key
        ]
        return sorted(found, key=self._key, reverse=True)

    def _fit(self, req: Request, budget: int, scheduled: set[int]) -> int:
        """Largest chunk for `req` this step, counting blocks its victims would give up."""
        n = min(req.num_remaining_tokens, budget)
        reclaimable = sum(len(self.kv.block_table(v.request_id)) for v in self._victims(req, scheduled))
        room = self.kv.num_placeable_tokens(req.request_id, req.num_computed_tokens)
        n = min(n, room + reclaimable * self.kv.block_size)
        if not self.config.allow_chunking and n < req.num_remaining_tokens:
            return 0
        return max(n, 0)

    def _make_room(self, req: Request, n: int, scheduled: set[int]) -> list[int]:
        preempted: list[int] = []
        need = blocks_for(req.num_computed_tokens + n, self.kv.block_size)
        victims = self._victims(req, scheduled)
        while len(self.kv.block_table(req.request_id)) + self.kv.pool.num_free < need:
            victim = victims.pop(0)
            self._preempt(victim)
            preempted.append(victim.request_id)
        return preempted

    def _preempt(self, req: Request) -> None:
        """Recompute preemption: blocks freed, progress and pooling reset, back to waiting."""
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.preempt()
        self.waiting.append(req)
        self.num_preemptions += 1

    # ---- results ---------------------------------------------------------------------------

    def update_from_output(
        self,
        output: SchedulerOutput,
        pooled_rows: Mapping[int, torch.Tensor],
        requests: Mapping[int, Request],
    ) -> list[Request]:
        """Advance every scheduled request; returns those whose prompt is now complete."""
        finished: list[Request] = []
        for chunk in output.chunks:
            req = requests.get(chunk.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted while its step ran
            req.pooling.update(chunk.start, chunk.num_tokens, pooled_rows[chunk.request_id])
            req.num_computed_tokens += chunk.num_tokens
            if req.is_prefill_complete:
                self.running.remove(req)
                self.kv.free(req.request_id)
                req.status = RequestStatus.FINISHED
                finished.append(req)
        return finished

    def fail(self, req: Request) -> None:
        self.abort(req)
        req.status = RequestStatus.FAILED
