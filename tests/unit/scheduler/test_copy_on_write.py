"""Forked tables share blocks by reference; a write into a shared block copies it first."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request
from tests.unit.scheduler.helpers import make_request


def beam(request_id: str, num_tokens: int) -> Request:
    request = Request.from_generate(make_request(request_id, num_tokens), 0, 0.0)
    request.beam_group_id = "group"
    return request


def test_fork_shares_every_block_and_the_first_write_copies_the_shared_one():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    parent = beam("p", 6)
    assert [b.block_id for b in kv.allocate_slots(parent, 6)] == [0, 1]
    parent.num_computed_tokens, parent.num_sent_blocks = 6, 2
    kv.cache_blocks(parent)
    child = parent.fork("c")
    kv.fork(parent, child)
    assert kv.get_block_ids("c") == [0, 1]
    assert [b.ref_count for b in kv.pool.blocks[:2]] == [2, 2]
    for r in (parent, child):
        r.all_token_ids.append(7)
    assert kv.copy_on_write(child) is True  # writes position 6, in shared block 1
    assert kv.get_block_ids("c") == [0, 2]
    assert kv.take_block_copies() == [(1, 2)]
    assert kv.copy_on_write(parent) is False  # block 1 is its own again: written in place
    assert kv.get_block_ids("p") == [0, 1]
    assert [b.ref_count for b in kv.pool.blocks[:3]] == [2, 1, 1]
    kv.check_integrity([parent, child])
    kv.free(child)
    kv.free(parent)
    assert kv.num_free_blocks == 8


def test_copy_on_write_changes_nothing_without_a_free_block():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    parent = beam("p", 6)
    kv.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    child = parent.fork("c")
    kv.fork(parent, child)
    assert kv.copy_on_write(child) is None
    assert kv.get_block_ids("c") == [0, 1] and kv.take_block_copies() == []


def test_only_beams_may_share_an_uncached_block():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    parent = beam("p", 6)
    kv.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    parent.num_sent_blocks = 2
    child = parent.fork("c")
    kv.fork(parent, child)
    kv.check_integrity([parent, child])
    child.beam_group_id = parent.beam_group_id = None
    with pytest.raises(AssertionError, match="shared by 2 tables but not cached"):
        kv.check_integrity([parent, child])


def test_a_copy_is_dropped_when_its_sequence_gives_its_blocks_back_before_the_plan():
    """A beam preempted while the step is planned frees its fresh block; taken again by
    another beam's copy in the same step, it must be copied into once (CI saw beam search
    under preemption read another beam's KV when the workers made both copies at once)."""
    kv = KVCacheManager(num_blocks=3, block_size=4)
    parent = beam("p", 6)
    kv.allocate_slots(parent, 6)  # blocks 0, 1; block 2 is the only free one
    parent.num_computed_tokens, parent.num_sent_blocks = 6, 2
    first, second = parent.fork("a"), parent.fork("b")
    kv.fork(parent, first)
    kv.fork(parent, second)
    assert kv.copy_on_write(first) is True  # block 1 -> 2
    kv.free(first)  # preempted before the plan was sent: block 2 is free again
    assert kv.copy_on_write(second) is True
    assert kv.get_block_ids("b") == [0, 2]  # the same block, taken again
    assert kv.take_block_copies() == [(1, 2)]
    kv.check_integrity([parent, second])
