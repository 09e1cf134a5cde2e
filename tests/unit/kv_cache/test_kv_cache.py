"""Block pool and block tables: chunk-by-chunk allocation, None when it cannot place."""

from __future__ import annotations

from embedserve.kv_cache.block_pool import BlockPool
from embedserve.kv_cache.manager import KVCacheManager


def test_allocates_chunk_by_chunk_and_frees() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate_slots(1, 0, 3) == [0]
    assert kv.allocate_slots(1, 3, 2) == [0, 1]  # crosses into a second block
    assert kv.pool.num_used == 2
    kv.free(1)
    assert kv.pool.num_free == 4 and kv.block_table(1) == []


def test_returns_none_and_takes_nothing_when_full() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=4)
    assert kv.allocate_slots(1, 0, 8) is not None
    assert kv.allocate_slots(2, 0, 8) is None
    assert kv.pool.num_free == 1 and kv.block_table(2) == []
    assert kv.num_placeable_tokens(2, 0) == 4
    assert kv.num_placeable_tokens(1, 6) == 6  # 2 held blocks + 1 free, 6 tokens in


def test_pool_hands_out_most_recently_freed_blocks_first() -> None:
    """LIFO reuse keeps the touched (resident) part of an untouched cache at peak use."""
    pool = BlockPool(8)
    first = pool.take(3)
    assert first == [0, 1, 2]
    pool.give_back(first)
    assert pool.take(2) == [0, 1]  # warm blocks again, not 3 and 4
    assert pool.take(2) == [2, 3]
    assert pool.num_free == 4
