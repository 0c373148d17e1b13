"""The physical KV blocks: reference counts, an LRU free queue and the prefix-cache map.

A block is free when no block table holds it (`ref_count == 0`). A free block keeps its hash,
so its KV can still be reused by a request with the same prefix, until it is evicted: taken
from the head of the free queue for new data, which drops the hash. Freed blocks go to the
tail, so the least recently freed cached block is evicted first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pagedserve.services.scheduler.block_residency import BlockResidency
from pagedserve.services.scheduler.cache_changes import CacheChangeLog
from pagedserve.shared.block_hash import DIGEST_SIZE


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # digest (block_hash.py), set once full and cached
    prev_free: KVBlock | None = None  # links of the free queue; None when not in it
    next_free: KVBlock | None = None


class FreeBlockQueue:
    """A doubly linked list threaded through the blocks themselves.

    Why not a deque: a prefix-cache hit on a free block must take that block out of the middle
    of the queue, which a deque does in O(n). Here it is O(1), with no allocation per op.
    Two sentinels remove every empty-list branch.
    """

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(block_id=-1)
        self._tail = KVBlock(block_id=-2)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise IndexError("no free block")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVBlock) -> None:
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVBlock]:
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def check_links(self) -> list[KVBlock]:
        """Walk both ways and assert the links agree; returns the blocks head to tail."""
        forward = list(self)
        backward = []
        block = self._tail.prev_free
        while block is not None and block is not self._head:
            backward.append(block)
            block = block.prev_free
        ids = [b.block_id for b in forward]
        assert forward == backward[::-1], f"free queue links disagree: forward {ids}"
        assert len(forward) == self.num_free_blocks, (
            f"free queue holds {len(forward)} blocks but counts {self.num_free_blocks}"
        )
        return forward


class BlockPool:
    """Owns every block. Callers hold blocks through `get_new_blocks` / `touch` and give them
    back with `free_blocks`; refcounts say how many block tables hold each block."""

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(block_id=i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached_blocks: dict[bytes, KVBlock] = {}  # block digest -> block holding that KV
        # what the cache map gained and lost since last published (cache_publisher.py)
        self.changes = CacheChangeLog(limit=2 * num_blocks)
        self.residency: BlockResidency | None = None  # --kv-cache-metrics

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self.cached_blocks.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock]:
        """Take `num_blocks` blocks from the head of the free queue (evicting their cached KV),
        each with refcount 1. All or nothing."""
        if num_blocks > self.free_queue.num_free_blocks:
            raise ValueError(
                f"asked for {num_blocks} blocks but only {self.num_free_blocks} are free"
            )
        new_blocks = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._evict(block)
            if self.residency is not None:
                self.residency.evicted(block.block_id)
                self.residency.allocated(block.block_id)
            block.ref_count = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take one more reference on each block (a prefix-cache hit)."""
        for block in blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1
            if self.residency is not None:
                self.residency.accessed(block.block_id)

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference on each block, in the order given: blocks reaching zero join the
        tail of the free queue in that order, so pass the ones to evict first first."""
        for block in blocks:
            if block.ref_count < 1:
                raise ValueError(f"block {block.block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue.append(block)

    def cache_full_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Record that `block` holds the KV of a full block with this hash. If another block
        already holds the same KV, keep that one: this block stays uncached."""
        if not self.enable_prefix_caching or block.block_hash is not None:
            return
        if block_hash in self.cached_blocks:
            return
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block
        self.changes.cached(block_hash)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block: the KV they held is gone (the workers restarted)."""
        for block in self.cached_blocks.values():
            block.block_hash = None
        self.cached_blocks.clear()
        self.changes.cleared()
        if self.residency is not None:
            self.residency.reset()

    def check_integrity(self, tables: Iterable[list[KVBlock]]) -> None:
        """Raise AssertionError naming the first broken invariant: refcounts equal to the
        block tables (`tables`) holding each block, the free queue exactly the unheld blocks,
        the cache map and the blocks' hashes in agreement. Walks every block."""
        self._check_refcounts(Counter(b.block_id for table in tables for b in table))
        self._check_free_queue()
        self._check_cache_map()

    def _check_refcounts(self, holders: Counter[int]) -> None:
        for block in self.blocks:
            assert block.ref_count == holders[block.block_id], (
                f"block {block.block_id} has ref_count {block.ref_count} but "
                f"{holders[block.block_id]} block tables hold it"
            )

    def _check_free_queue(self) -> None:
        free_ids = [b.block_id for b in self.free_queue.check_links()]
        assert len(set(free_ids)) == len(free_ids), f"free queue repeats blocks: {free_ids}"
        zero_ids = {b.block_id for b in self.blocks if b.ref_count == 0}
        assert set(free_ids) == zero_ids, (
            f"free queue {sorted(free_ids)} != blocks with ref_count 0 {sorted(zero_ids)}"
        )
        for block in self.blocks:
            if block.ref_count > 0:
                assert block.prev_free is None and block.next_free is None, (
                    f"held block {block.block_id} still has free-queue links"
                )

    def _check_cache_map(self) -> None:
        for block_hash, block in self.cached_blocks.items():
            assert isinstance(block_hash, bytes) and len(block_hash) == DIGEST_SIZE, (
                f"cache map key {block_hash!r} is not a {DIGEST_SIZE}-byte block digest"
            )
            assert block.block_hash == block_hash, (
                f"cache map points hash {_short_hex(block_hash)} at block {block.block_id}, "
                f"whose hash is {_short_hex(block.block_hash)}"
            )
        num_hashed = sum(1 for b in self.blocks if b.block_hash is not None)
        assert num_hashed == len(self.cached_blocks), (
            f"{num_hashed} blocks carry a hash but the cache map has {len(self.cached_blocks)}"
        )

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_blocks.get(block.block_hash) is block:
            del self.cached_blocks[block.block_hash]
            self.changes.evicted(block.block_hash)
        block.block_hash = None


def _short_hex(digest: bytes | None) -> str:
    return "none" if digest is None else digest.hex()[:16]
