"""The scheduler's and the KV cache's invariants, checked in full. For tests (after every step)
and for an idle engine; it walks every block, so it is not for the hot path. Each layer checks
its own: `Scheduler.check_integrity` its request sets, then `KVCacheManager.check_integrity`
its tables and pool."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from pagedserve.services.scheduler.request import RequestStatus
from pagedserve.shared.block_hash import DIGEST_SIZE

if TYPE_CHECKING:
    from pagedserve.services.scheduler.block_pool import BlockPool, KVBlock
    from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
    from pagedserve.services.scheduler.request import Request
    from pagedserve.services.scheduler.scheduler import Scheduler


def check_integrity(scheduler: Scheduler) -> None:
    """Raise AssertionError naming what is wrong with the scheduler or its KV cache."""
    _check_requests(scheduler)
    scheduler.kv.check_integrity(scheduler.running)


def check_kv_integrity(
    kv: KVCacheManager, tables: dict[str, list[KVBlock]], running: list[Request]
) -> None:
    """Raise AssertionError naming what is wrong with the block tables or the pool."""
    stray = set(tables) - {r.request_id for r in running}
    assert not stray, f"block tables of requests not running: {sorted(stray)}"
    _check_refcounts(kv.pool, tables)
    _check_free_queue(kv.pool)
    _check_cache_map(kv.pool)
    _check_tables(kv.block_size, tables, running)


def _check_requests(scheduler: Scheduler) -> None:
    waiting = list(scheduler.waiting)
    running = scheduler.running
    waiting_ids = [r.request_id for r in waiting]
    running_ids = [r.request_id for r in running]
    assert len(set(waiting_ids)) == len(waiting_ids), f"duplicate waiting ids: {waiting_ids}"
    assert len(set(running_ids)) == len(running_ids), f"duplicate running ids: {running_ids}"
    both = set(waiting_ids) & set(running_ids)
    assert not both, f"requests both waiting and running: {sorted(both)}"
    live = set(waiting_ids) | set(running_ids)
    assert live == set(scheduler.requests), (
        f"live requests {sorted(scheduler.requests)} != waiting + running {sorted(live)}"
    )
    for r in waiting:
        assert r.status is RequestStatus.WAITING, f"{r.request_id} waiting with {r.status}"
        assert scheduler.kv.num_blocks_held(r.request_id) == 0, (
            f"waiting request {r.request_id} holds blocks"
        )
    for r in running:
        assert r.status is RequestStatus.RUNNING, f"{r.request_id} running with {r.status}"
    assert len(running) <= scheduler.config.max_num_seqs, (
        f"{len(running)} running > max_num_seqs {scheduler.config.max_num_seqs}"
    )


def _check_refcounts(pool: BlockPool, tables: dict[str, list[KVBlock]]) -> None:
    holders = Counter(b.block_id for t in tables.values() for b in t)
    for block in pool.blocks:
        assert block.ref_count == holders[block.block_id], (
            f"block {block.block_id} has ref_count {block.ref_count} but "
            f"{holders[block.block_id]} block tables hold it"
        )
        if block.ref_count > 1:
            assert block.block_hash is not None, (
                f"block {block.block_id} is shared by {block.ref_count} tables but not cached"
            )


def _check_free_queue(pool: BlockPool) -> None:
    free = pool.free_queue.check_links()
    free_ids = [b.block_id for b in free]
    assert len(set(free_ids)) == len(free_ids), f"free queue repeats blocks: {free_ids}"
    zero_ids = {b.block_id for b in pool.blocks if b.ref_count == 0}
    assert set(free_ids) == zero_ids, (
        f"free queue {sorted(free_ids)} != blocks with ref_count 0 {sorted(zero_ids)}"
    )
    for block in pool.blocks:
        if block.ref_count > 0:
            assert block.prev_free is None and block.next_free is None, (
                f"held block {block.block_id} still has free-queue links"
            )


def _check_cache_map(pool: BlockPool) -> None:
    for block_hash, block in pool.cached_blocks.items():
        assert isinstance(block_hash, bytes) and len(block_hash) == DIGEST_SIZE, (
            f"cache map key {block_hash!r} is not a {DIGEST_SIZE}-byte block digest"
        )
        assert block.block_hash == block_hash, (
            f"cache map points hash {_short_hex(block_hash)} at block {block.block_id}, "
            f"whose hash is {_short_hex(block.block_hash)}"
        )
    num_hashed = sum(1 for b in pool.blocks if b.block_hash is not None)
    assert num_hashed == len(pool.cached_blocks), (
        f"{num_hashed} blocks carry a hash but the cache map has {len(pool.cached_blocks)}"
    )


def _short_hex(digest: bytes | None) -> str:
    return "none" if digest is None else digest.hex()[:16]


def _check_tables(
    block_size: int, tables: dict[str, list[KVBlock]], running: list[Request]
) -> None:
    for r in running:
        table = tables.get(r.request_id, [])
        ids = [b.block_id for b in table]
        assert len(set(ids)) == len(ids), f"{r.request_id}'s table repeats blocks: {ids}"
        assert len(table) * block_size >= r.num_computed_tokens, (
            f"{r.request_id}'s table of {len(table)} blocks cannot hold its "
            f"{r.num_computed_tokens} computed tokens"
        )
        # while a step is out, its draft tokens count as computed beyond the known tokens
        assert r.num_computed_tokens <= r.num_tokens + r.num_draft_tokens, (
            f"{r.request_id} computed {r.num_computed_tokens} of {r.num_tokens} tokens "
            f"and {r.num_draft_tokens} drafts"
        )
        assert r.num_sent_blocks == len(table), (
            f"{r.request_id}: workers know {r.num_sent_blocks} blocks, table has {len(table)}"
        )
