"""Blocks that slid out of every layer's window go back to the free pool while a request
still runs; no step reads a block it was given back (the fake worker checks each step's
window, and the blocks given back are reused by others and overwritten)."""

from __future__ import annotations

from pagedserve.services.scheduler.kv_cache_manager import SKIPPED_BLOCK_ID
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step


def test_blocks_before_the_window_return_to_the_pool_during_a_long_generation() -> None:
    s = make_scheduler(num_blocks=16, block_size=4, max_model_len=64, sliding_window=8)
    w = FakeWorker(s.num_blocks, s.block_size, sliding_window=8)
    s.add_request(make_request("a", 6, max_tokens=40))
    run_step(s, w)  # the prompt: blocks 0, 1
    assert s.kv.get_block_ids("a") == [0, 1]
    held = []
    for _ in range(30):
        run_step(s, w)
        held.append(16 - s.kv.num_free_blocks)
    # The last step computed the token at 35, which sees 28-35: blocks 7 and 8 of 9.
    ids = s.kv.get_block_ids("a")
    assert len(ids) == 9 and ids[:7] == [SKIPPED_BLOCK_ID] * 7
    assert SKIPPED_BLOCK_ID not in ids[7:]
    assert s.kv.num_free_blocks == 16 - 2
    assert max(held) <= 3  # the window's blocks and the one being filled, however long


def test_a_second_request_reuses_the_blocks_the_first_gave_back() -> None:
    s = make_scheduler(num_blocks=8, block_size=4, max_model_len=64, sliding_window=4)
    w = FakeWorker(s.num_blocks, s.block_size, sliding_window=4)
    s.add_request(make_request("a", 4, max_tokens=28, ignore_eos=True))
    for _ in range(20):
        run_step(s, w)
    # a has 24 tokens in 6 table places but holds only its last blocks
    assert s.kv.num_free_blocks >= 5
    s.add_request(make_request("b", 16, max_tokens=4))
    for _ in range(8):  # b's prompt lands in blocks a gave back; a keeps its window intact
        run_step(s, w)
    s.check_integrity()


def test_without_a_window_every_block_stays_held() -> None:
    s = make_scheduler(num_blocks=16, block_size=4, max_model_len=64)
    w = FakeWorker(s.num_blocks, s.block_size)
    s.add_request(make_request("a", 6, max_tokens=40))
    for _ in range(31):
        run_step(s, w)
    assert s.kv.num_free_blocks == 16 - 9
