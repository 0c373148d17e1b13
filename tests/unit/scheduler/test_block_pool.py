from __future__ import annotations

import pytest

from pagedserve.services.scheduler.block_pool import BlockPool, FreeBlockQueue, KVBlock
from pagedserve.shared.block_hash import hash_block


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_queue]


def test_free_queue_removes_from_the_middle_and_keeps_order() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3, 4]
    assert queue.popleft() is blocks[0]
    queue.append(blocks[2])
    assert [b.block_id for b in queue.check_links()] == [1, 3, 4, 2]
    assert queue.num_free_blocks == 4


def test_free_queue_rejects_double_insert_and_removal_of_absent_block() -> None:
    blocks = [KVBlock(i) for i in range(2)]
    queue = FreeBlockQueue(blocks)
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[0])
    queue.remove(blocks[0])
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[0])
    queue.popleft()
    with pytest.raises(IndexError):
        queue.popleft()


def test_allocation_takes_from_head_and_freed_blocks_go_to_tail() -> None:
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    assert [b.block_id for b in a] == [0, 1]
    assert all(b.ref_count == 1 for b in a)
    pool.free_blocks(reversed(a))
    assert free_ids(pool) == [2, 3, 1, 0]


def test_all_or_nothing_allocation_and_over_free() -> None:
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="asked for 3 blocks but only 2 are free"):
        pool.get_new_blocks(3)
    assert pool.num_free_blocks == 2
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(ValueError, match="freed more often than taken"):
        pool.free_blocks([block])


def test_cached_free_block_is_reusable_until_evicted() -> None:
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    digest = hash_block(None, [1, 2, 3, 4])
    pool.cache_full_block(block, digest)
    pool.free_blocks([block])
    assert pool.get_cached_block(digest) is block  # still cached while free
    pool.touch([block])  # a hit takes it out of the free queue
    assert block.ref_count == 1 and free_ids(pool) == [1]
    pool.free_blocks([block])
    assert free_ids(pool) == [1, 0]
    pool.get_new_blocks(2)  # reusing block 0 for new data evicts its KV
    assert pool.get_cached_block(digest) is None and block.block_hash is None


def test_duplicate_content_keeps_the_first_cached_block() -> None:
    pool = BlockPool(2)
    first, second = pool.get_new_blocks(2)
    digest = hash_block(None, [9])
    pool.cache_full_block(first, digest)
    pool.cache_full_block(second, digest)
    assert pool.get_cached_block(digest) is first and second.block_hash is None


def test_prefix_caching_disabled_caches_nothing() -> None:
    pool = BlockPool(1, enable_prefix_caching=False)
    (block,) = pool.get_new_blocks(1)
    digest = hash_block(None, [5])
    pool.cache_full_block(block, digest)
    assert pool.get_cached_block(digest) is None


def test_num_blocks_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_blocks must be >= 1, got 0"):
        BlockPool(0)


def test_pool_integrity_holds_and_names_each_broken_invariant() -> None:
    pool = BlockPool(4)
    table = pool.get_new_blocks(2)
    pool.cache_full_block(table[0], hash_block(None, [1, 2]))
    pool.check_integrity([table])
    with pytest.raises(AssertionError, match="block 1 has ref_count 1 but 0 block tables"):
        pool.check_integrity([table[:1]])  # a table forgot a block it holds: a leak
    pool.touch(table[1:])  # a second reference on an uncached block: a fork's (beams)
    pool.check_integrity([table, table[1:]])  # the KV cache manager checks who shares it
    pool.free_blocks(table[1:])
    table[0].block_hash = hash_block(None, [3, 4])  # the map still files it under [1, 2]
    with pytest.raises(AssertionError, match="cache map points hash"):
        pool.check_integrity([table])
