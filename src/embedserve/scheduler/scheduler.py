"""Continuous batching for embeddings under a per-step token budget.

Every request orders by the shared key (scheduler/policy.py): `online` before `batch` (a
batch request that waited `batch_aging_steps` steps without work counts as online), then first come, first
served. Each step walks requests in key order and gives each the largest chunk that the budget and
the KV cache allow; while online work is queued, batch requests share only a small part of
the step (`batch_tokens_with_online`), so an online query never rides in a long step, and while
online work comes, batch steps stay short (scheduler/policy.py BatchAllowance), so one never
waits long for the step in progress.
A request may take blocks from requests with a *larger* key (preemption by recompute).
The smallest key can take every block and admission guaranteed its prompt fits the whole
cache, so it always advances: nothing livelocks and nothing starves.

Prompts of at least `layer_major_tokens` go to the layer-major lane's queue instead
(scheduler/lane.py); each step's output also says how much of the step the lane gets. The
scheduler holds no tensors: the engine folds the rows a step pooled, then calls
`update_from_output` to advance the requests.
"""

from __future__ import annotations

from collections.abc import Mapping

from embedserve.config import SchedulerConfig
from embedserve.errors import InvalidInputError
from embedserve.kv_cache.manager import Copy, KVCacheManager, block_hashes, blocks_for
from embedserve.request import Priority, Request, RequestStatus
from embedserve.scheduler.lane import LaneQueue
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput
from embedserve.scheduler.policy import BatchAllowance, PriorityClock


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, num_layers: int = 0) -> None:
        """`num_layers`: the model's, for the layer-major lane's slices (with `layer_major_tokens`)."""
        self.config = config
        self.kv = kv
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.clock = PriorityClock(config.batch_aging_steps)
        self.num_preemptions = 0
        self.lane: LaneQueue | None = None
        if config.layer_major_tokens is not None:
            self.lane = LaneQueue(
                config.layer_major_tokens, config.max_num_batched_tokens, num_layers, config.batch_aging_steps
            )
        self._copies: dict[int, Copy] = {}  # this step's pinned-tail copies, by request
        # Batch work's share of each step, from when online work came and how long steps took.
        self.allowance = BatchAllowance(config.max_num_batched_tokens, config.batch_cap_with_online)

    @property
    def step_count(self) -> int:
        return self.clock.ticks

    def in_lane(self, num_tokens: int) -> bool:
        return self.lane is not None and self.lane.accepts(num_tokens)

    # ---- admission -------------------------------------------------------------------------

    def check_admissible(self, num_tokens: int) -> None:
        """Raise if a prompt of this length could never run."""
        if num_tokens < 1:
            raise InvalidInputError("input is empty: it has no tokens")
        if num_tokens > self.config.max_model_len:
            raise InvalidInputError(f"{num_tokens} tokens exceed max_model_len ({self.config.max_model_len})")
        if self.in_lane(num_tokens):
            return  # the lane keeps no KV cache
        if blocks_for(num_tokens, self.kv.block_size) > self.kv.num_blocks:
            raise InvalidInputError(
                f"{num_tokens} tokens exceed the whole KV cache ({self.kv.max_tokens} tokens); "
                "raise kv_cache_memory"
            )

    def check_images(self, largest: int) -> None:
        """Raise if an image of `largest` tokens could never run: one step holds a whole image."""
        if largest > self.config.max_num_batched_tokens:
            raise InvalidInputError(
                f"an image of {largest} tokens exceeds the token budget "
                f"({self.config.max_num_batched_tokens}); use a smaller image or a larger budget"
            )

    def add_request(self, req: Request) -> None:
        self.check_admissible(req.num_prompt_tokens)
        if req.mm is not None:
            self.check_images(max((s.image.num_tokens for s in req.mm.spans), default=0))
        if self.lane is not None and self.lane.accepts(req.num_prompt_tokens):
            self.lane.add(req)
            return
        if self.kv.prefix_caching and req.mm is None:  # image tokens: equal ids, other images
            req.block_hashes = block_hashes(req.token_ids, self.kv.block_size, req.cache_root)
        self.clock.stamp(req)
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        in_lane = self.lane is not None and self.lane.drop(req.request_id)
        if not in_lane and req in self.running:
            self.running.remove(req)
        elif not in_lane and req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.request_id)  # none held by a lane prompt
        req.status = RequestStatus.ABORTED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running) or (self.lane is not None and self.lane.has_work)

    def has_online_work(self) -> bool:
        """Any chunked request left that schedules as online (including aged batch requests)."""
        return any(self.clock.is_online(r) for r in self.running + self.waiting)

    # ---- one step --------------------------------------------------------------------------

    def _key(self, req: Request) -> tuple[int, int]:
        return self.clock.key(req)

    def schedule(self) -> SchedulerOutput:
        online = self.has_online_work()
        alone = not (self.waiting or self.running)
        self.clock.tick()
        self._copies = {}
        chunks, preempted = self._schedule_chunks()
        lane = None
        if self.lane is not None:
            recent = self.allowance.recent()
            lane = self.lane.slice(online, recent, alone, self.config.max_num_batched_tokens)
        copies = [self._copies[c.request_id] for c in chunks if c.request_id in self._copies]
        return SchedulerOutput(self.step_count, chunks, preempted, lane, online, copies)

    def observe(self, output: SchedulerOutput, seconds: float) -> None:
        """The chunks of `output` took `seconds`: a step with online work sizes the lane's
        timed units and batch work's share of the next steps."""
        tokens = sum(len(c.token_ids) for c in output.chunks)
        self.allowance.observe(output.online, tokens, seconds)

    def _schedule_chunks(self) -> tuple[list[ScheduledChunk], list[int]]:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[int] = []
        scheduled: set[int] = set()
        candidates = sorted(self.running + self.waiting, key=self._key)
        online_queued = any(self._key(r)[0] == 0 for r in candidates)
        batch_left = self.allowance.tokens(online_queued)
        for req in candidates:
            if budget == 0:
                break
            is_batch = self._key(req)[0] == 1
            if req.request_id in preempted:
                continue  # just lost its blocks to a more urgent request; retry next step
            if req.status is RequestStatus.WAITING and len(self.running) >= self.config.max_num_seqs:
                continue
            hit = self._attach_prefix(req)
            n = self._fit(req, min(budget, batch_left) if is_batch else budget, scheduled)
            if n == 0 and is_batch and not chunks and not online_queued:
                n = self._fit_alone(req, budget, scheduled)
            if n == 0:
                if hit:  # not this step: let go of the shared blocks while it waits
                    self._detach_prefix(req)
                continue
            if req.block_hashes is not None and req.status is RequestStatus.WAITING:
                self.kv.count_lookup(req.num_prompt_tokens, hit)
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
                    token_type_ids=None
                    if req.token_type_ids is None
                    else req.token_type_ids[start : start + n],
                    multimodal=req.mm,
                    attend_keys=req.attend_keys,
                    adapter=req.adapter,
                )
            )
            scheduled.add(req.request_id)
            budget -= n
            if is_batch:
                batch_left -= n
            if req.priority is Priority.BATCH:
                self.clock.progressed(req)
        return chunks, preempted

    def _attach_prefix(self, req: Request) -> int:
        """A waiting request starts from the cached blocks of its prefix where its pooling never
        reads those rows (always one token left to compute); returns the tokens hit."""
        hashes = req.block_hashes
        if hashes is None or req.status is not RequestStatus.WAITING or req.num_computed_tokens:
            return 0
        hit, copy = self.kv.attach_prefix(
            req.request_id, req.token_ids, hashes, req.pooling.skippable, req.cache_root
        )
        if copy is not None:
            self._copies[req.request_id] = copy
        if hit:
            req.num_computed_tokens = hit
            req.pooling.skip(hit)
        return hit

    def _detach_prefix(self, req: Request) -> None:
        self._copies.pop(req.request_id, None)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.pooling.reset()

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
        reclaimable = self.kv.reclaimable([v.request_id for v in self._victims(req, scheduled)])
        room = self.kv.num_placeable_tokens(req.request_id, req.num_computed_tokens)
        n = min(n, room + reclaimable * self.kv.block_size)
        if not self.config.allow_chunking and n < req.num_remaining_tokens:
            return 0
        chunk = self.config.deterministic_chunk
        if chunk is not None and n < req.num_remaining_tokens:
            n -= n % chunk  # chunks end on multiples of it (the prompt's end excepted)
        if req.mm is not None and n < req.num_remaining_tokens:
            n = req.mm.cut(req.num_computed_tokens, n)  # never inside an image: before it
        return max(n, 0)

    def _fit_alone(self, req: Request, budget: int, scheduled: set[int]) -> int:
        """A batch request in a step that holds nothing else: its smallest chunk that can run (a
        deterministic chunk; the whole prompt of an encoder or up to an image), rather than none."""
        chunk = self.config.deterministic_chunk
        for limit in (budget if chunk is None else min(budget, chunk), budget):
            n = self._fit(req, limit, scheduled)
            if n:
                return n
        return 0

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

    def update_from_output(self, output: SchedulerOutput, requests: Mapping[int, Request]) -> list[Request]:
        """Advance every scheduled request (its pooled rows already folded); returns those
        whose prompt is now complete."""
        finished: list[Request] = []
        for chunk in output.chunks:
            req = requests.get(chunk.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted while its step ran
            req.num_computed_tokens += chunk.num_tokens
            if req.block_hashes is not None:
                self.kv.register(req.request_id, req.block_hashes, req.num_computed_tokens)
            if req.is_prefill_complete:
                if req.pin_prefix and req.block_hashes is not None:
                    self.kv.pin_prompt(
                        req.request_id, req.token_ids, req.block_hashes, req.pin_prefix, req.cache_root
                    )
                self.running.remove(req)
                self.kv.free(req.request_id)
                if req.mm is not None:
                    req.mm.release()
                req.status = RequestStatus.FINISHED
                finished.append(req)
        return finished

    def finish_lane(self, req: Request) -> None:
        """A lane prompt's last layer ran and its rows were folded."""
        assert self.lane is not None
        self.lane.finish(req)

    def fail(self, req: Request) -> None:
        self.abort(req)
        req.status = RequestStatus.FAILED
