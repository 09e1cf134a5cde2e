"""A pool of fixed-size KV blocks, handed out by id, reference-counted.

Most recently freed blocks go out first (LIFO). The cache tensors are allocated untouched
(`torch.empty`), so the operating system backs only the pages a block ever held: reusing
warm blocks keeps resident memory at the peak number of blocks in use, not the whole cache.

Prefix caching (kv_cache/manager.py): a full block whose K/V a finished or preempted request
computed keeps its content under its hash while nobody holds it ("cached"), least recently
released first out when blocks run short, at most `max_cached` of them (the rest go back to the
free list), so the cache adds at most `max_cached` blocks to resident memory. A request that
starts with the same tokens takes the cached blocks (`share`): several requests may hold one
block; it is released when the last one lets go.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class BlockPool:
    def __init__(self, num_blocks: int, max_cached: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.max_cached = max_cached
        self._free: deque[int] = deque(range(num_blocks))
        self._refs: dict[int, int] = {}  # blocks held by requests -> holders
        self._cached: OrderedDict[int, bytes] = OrderedDict()  # held by nobody, content kept: LRU first
        self.hash_of: dict[int, bytes] = {}  # a block's content hash (registered full blocks)
        self.by_hash: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached ones are evicted for it)."""
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._cached)

    @property
    def num_cached(self) -> int:
        """Blocks whose content is kept for a prefix hit (held or not)."""
        return len(self.by_hash)

    def refs(self, block: int) -> int:
        return self._refs.get(block, 0)

    def take(self, n: int) -> list[int] | None:
        """`n` blocks for new content, or None (taking nothing) when fewer can be had: free
        ones first, then cached ones, least recently released first (their hash forgotten)."""
        if n > self.num_free:
            return None
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._cached.popitem(last=False)
                self._forget(block)
            self._refs[block] = 1
            out.append(block)
        return out

    def share(self, blocks: list[int]) -> None:
        """Another holder for each of `blocks` (cached content a request starts from)."""
        for block in blocks:
            self._cached.pop(block, None)
            self._refs[block] = self._refs.get(block, 0) + 1

    def register(self, block: int, digest: bytes) -> bool:
        """Keep `block`'s content under `digest` (its full tokens' hash chain); False when that
        content is already kept in another block."""
        if digest in self.by_hash or block in self.hash_of:
            return False
        self.by_hash[digest] = block
        self.hash_of[block] = digest
        return True

    def give_back(self, block_ids: list[int]) -> None:
        """One holder fewer for each block; a block nobody holds is cached if it has a hash,
        else free (taken again first, in the same order)."""
        freed = []
        for block in block_ids:
            left = self._refs[block] - 1
            if left > 0:
                self._refs[block] = left
                continue
            del self._refs[block]
            digest = self.hash_of.get(block)
            if digest is not None and self.max_cached > 0:
                self._cached[block] = digest
            else:
                self._forget(block)
                freed.append(block)
        self._free.extendleft(reversed(freed))
        while len(self._cached) > self.max_cached:
            block, _ = self._cached.popitem(last=False)
            self._forget(block)
            self._free.appendleft(block)

    def _forget(self, block: int) -> None:
        digest = self.hash_of.pop(block, None)
        if digest is not None:
            del self.by_hash[digest]
