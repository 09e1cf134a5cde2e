"""Block tables per request; blocks are allocated chunk by chunk as a request advances."""

from __future__ import annotations

from embedserve.kv_cache.block_pool import BlockPool


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._tables: dict[int, list[int]] = {}

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
        self.pool.give_back(self._tables.pop(request_id, []))
