"""A pool of fixed-size KV blocks, handed out by id.

Most recently freed blocks go out first (LIFO). The cache tensors are allocated untouched
(`torch.empty`), so the operating system backs only the pages a block ever held: reusing
warm blocks keeps resident memory at the peak number of blocks in use, not the whole cache.
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def take(self, n: int) -> list[int] | None:
        """`n` free block ids, or None (taking nothing) when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.popleft() for _ in range(n)]

    def give_back(self, block_ids: list[int]) -> None:
        self._free.extendleft(reversed(block_ids))  # taken again first, in the same order
