from __future__ import annotations

from pagedserve.services.scheduler.cache_changes import CacheChangeLog
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step


def test_changes_are_netted_between_takes() -> None:
    log = CacheChangeLog(limit=10)
    assert log.take().needs_full  # nothing published yet
    log.cached(b"a")
    log.cached(b"b")
    log.evicted(b"b")  # cached and gone before a publish: sent as a removal only
    log.evicted(b"c")
    delta = log.take()
    assert (delta.added, sorted(delta.removed), delta.needs_full) == ([b"a"], [b"b", b"c"], False)
    assert log.take().added == [] and log.take().removed == []


def test_overflow_and_reset_ask_for_the_whole_cache() -> None:
    log = CacheChangeLog(limit=2)
    log.take()
    for digest in (b"a", b"b", b"c"):
        log.cached(digest)
    delta = log.take()
    assert delta.needs_full and delta.added == []
    log.cached(b"d")
    log.cleared()
    assert log.take().needs_full


def test_the_block_pool_logs_what_it_caches_and_evicts() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=32)
    kv = scheduler.kv
    kv.take_cache_changes()  # the initial full publish
    worker = FakeWorker(num_blocks=4, block_size=4)
    scheduler.add_request(make_request("r1", 9, max_tokens=1))
    while scheduler.has_unfinished_requests():
        run_step(scheduler, worker)
    first = kv.take_cache_changes()
    assert sorted(first.added) == sorted(kv.cached_block_hashes()) and len(first.added) == 2
    scheduler.add_request(make_request("r2", [5] * 13, max_tokens=1))  # needs every block
    while scheduler.has_unfinished_requests():
        run_step(scheduler, worker)
    second = kv.take_cache_changes()
    assert set(first.added) <= set(second.removed)  # r1's blocks were evicted for r2's
    assert set(second.added) == set(kv.cached_block_hashes())
