"""The tokenizer pool runs at most `num_threads` jobs at once; the others wait their turn."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pagedserve.services.gateway.tokenizer_pool import TokenizerPool


def test_at_most_num_threads_run_at_once() -> None:
    pool = TokenizerPool(2)
    lock = threading.Lock()
    running, most = 0, 0
    release = threading.Event()

    def job(value: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1
        return value * 2

    async def main() -> list[int]:
        tasks = [asyncio.ensure_future(pool.run(job, i)) for i in range(6)]
        while most < 2:  # the pool is full; the other four wait
            await asyncio.sleep(0.01)
        release.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == [0, 2, 4, 6, 8, 10]
    assert most == 2
    pool.close()


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        TokenizerPool(0)
