"""Block tables per request; blocks are allocated chunk by chunk as a request advances.

Prefix caching (on when `max_cached` > 0): every full block a request computed is registered
under the hash chain of its tokens (`block_hashes`: block i's digest covers tokens
[0, (i + 1) * block_size), so equal digests mean equal tokens at equal positions, hence equal
K/V for one model). A request starting with registered blocks shares them read-only
(`attach_prefix`) and computes only the rest; its later blocks are its own. One engine has one
model, dtype and option set, and one KV cache: nothing is shared across them.

A prompt the engine applies itself (an instruction) is pinned whole (`pin_prompt`): its full
blocks stay held, and so does the block holding its tail (the tokens past the last full block:
a 19-token instruction is one full 16-token block and a 3-token tail). A request whose tokens
continue the full blocks with (part of) that tail gets a block of its own with the tail's rows
copied in (`Copy`, done by the runner before the step's forward pass): the K/V of a position
depends only on the tokens up to it, so the rows of any common prefix of the tail are valid.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embedserve.kv_cache.block_pool import BlockPool


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def block_hashes(token_ids: Sequence[int], block_size: int, root: bytes = b"") -> list[bytes]:
    """The hash chain of every full block of `token_ids`, from `root` (a LoRA adapter's: K/V
    computed under one set of weights is never found by requests of another)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    out: list[bytes] = []
    prev = root
    for i in range(len(ids) // block_size):
        prev = hashlib.sha256(prev + ids[i * block_size : (i + 1) * block_size].tobytes()).digest()
        out.append(prev)
    return out


@dataclass(frozen=True)
class Copy:
    """Rows [0, rows) of block `src` into block `dst`, every layer (a pinned prompt's tail)."""

    src: int
    dst: int
    rows: int


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_cached: int = 0) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, max_cached)
        self._tables: dict[int, list[int]] = {}
        self._registered: dict[int, int] = {}  # request -> its leading blocks already registered
        # Pinned prompt tails by the digest of the full blocks before them: (tokens, block).
        self._tails: dict[bytes, list[tuple[tuple[int, ...], int]]] = {}
        self.pinned: set[int] = set()  # blocks the pinned prompts hold
        self.hit_tokens = 0  # prompt tokens served from cached blocks
        self.query_tokens = 0  # prompt tokens of the requests that looked for a prefix

    @property
    def prefix_caching(self) -> bool:
        return self.pool.max_cached > 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def max_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size

    def block_table(self, request_id: int) -> list[int]:
        return self._tables.get(request_id, [])

    def num_placeable_tokens(self, request_id: int, num_computed: int) -> int:
        """How many more tokens of this request fit without taking anyone's blocks."""
        held = len(self._tables.get(request_id, []))
        return (held + self.pool.num_free) * self.block_size - num_computed

    def reclaimable(self, request_ids: Sequence[int]) -> int:
        """Blocks that freeing all of `request_ids` would make available (a block another
        request also holds stays taken)."""
        holders: dict[int, int] = {}
        for rid in request_ids:
            for block in self._tables.get(rid, []):
                holders[block] = holders.get(block, 0) + 1
        return sum(1 for block, n in holders.items() if n == self.pool.refs(block))

    def attach_prefix(
        self, request_id: int, token_ids: Sequence[int], hashes: Sequence[bytes], most: int, root: bytes = b""
    ) -> tuple[int, Copy | None]:
        """Give a request without blocks the cached blocks its first full blocks match, then a
        pinned prompt tail's rows (in a block of its own, with the copy to make), at most `most`
        tokens' worth in all; returns (tokens hit, the copy or None)."""
        assert request_id not in self._tables, "a prefix is attached before any block"
        bs = self.block_size
        blocks: list[int] = []
        for digest in hashes[: most // bs]:
            block = self.pool.by_hash.get(digest)
            if block is None:
                break
            blocks.append(block)
        hit = len(blocks) * bs
        tail, src = self._tail(
            token_ids[hit : min(most, hit + bs)], hashes[len(blocks) - 1] if blocks else root
        )
        copy = None
        if tail:
            own = self.pool.take(1)
            if own is not None:
                copy = Copy(src, own[0], tail)
                hit += tail
                self._tables[request_id] = [*blocks, own[0]]
        if blocks:
            self.pool.share(blocks)
            self._tables.setdefault(request_id, blocks)
            self._registered[request_id] = len(blocks)
        return hit, copy

    def _tail(self, tokens: Sequence[int], before: bytes) -> tuple[int, int]:
        """(rows, block) of the pinned tail after `before` that `tokens` continue longest."""
        best, src = 0, -1
        for tail, block in self._tails.get(before, []):
            n = next((i for i, (a, b) in enumerate(zip(tail, tokens, strict=False)) if a != b), None)
            n = min(len(tail), len(tokens)) if n is None else n
            if n > best:
                best, src = n, block
        return best, src

    def pin_prompt(
        self, request_id: int, token_ids: Sequence[int], hashes: Sequence[bytes], n: int, root: bytes = b""
    ) -> None:
        """Keep the K/V of the request's first `n` tokens (a prompt, computed) for good: its full
        blocks held, its tail's block held and findable by `attach_prefix` (once per tail)."""
        table = self._tables.get(request_id, [])
        full = min(n // self.block_size, len(table))
        # Its full blocks where they are the registered ones (another copy of the same content
        # is not kept twice), and its tail's block once per distinct tail.
        keep = [b for i, b in enumerate(table[:full]) if self.pool.hash_of.get(b) == hashes[i]]
        keep = [b for b in keep if b not in self.pinned]
        rows = n - full * self.block_size
        if 0 < rows < self.block_size and len(table) > full:
            tail = tuple(token_ids[full * self.block_size : n])
            tails = self._tails.setdefault(hashes[full - 1] if full else root, [])
            if all(t != tail for t, _ in tails):
                tails.append((tail, table[full]))
                keep.append(table[full])
        self.pool.share(keep)
        self.pinned.update(keep)

    def count_lookup(self, num_prompt_tokens: int, hit: int) -> None:
        self.query_tokens += num_prompt_tokens
        self.hit_tokens += hit

    def register(self, request_id: int, hashes: Sequence[bytes], num_computed: int) -> None:
        """Register the request's full blocks whose K/V is now computed (tokens < num_computed)."""
        table = self._tables.get(request_id, [])
        done = self._registered.get(request_id, 0)
        full = min(num_computed // self.block_size, len(hashes), len(table))
        for i in range(done, full):
            self.pool.register(table[i], hashes[i])
        self._registered[request_id] = max(done, full)

    def allocate_slots(self, request_id: int, num_computed: int, n: int) -> list[int] | None:
        """Grow the table so tokens [0, num_computed + n) have slots.

        Returns the request's full block table, or None (allocating nothing) if the pool
        cannot place the chunk; the caller decides whom to preempt.
        """
        table = self._tables.get(request_id, [])
        missing = blocks_for(num_computed + n, self.block_size) - len(table)
        if missing > 0:
            new = self.pool.take(missing)
            if new is None:
                return None
            table = table + new
            self._tables[request_id] = table
        return table

    def free(self, request_id: int) -> None:
        self._registered.pop(request_id, None)
        self.pool.give_back(self._tables.pop(request_id, []))
