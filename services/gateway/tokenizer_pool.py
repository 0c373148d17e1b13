"""A few threads that tokenize, so that a burst of big prompts queues here instead of taking
every thread and the event loop's attention: /health and small requests stay fast while
large prompts wait their turn."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_TOKENIZER_THREADS = 2


class TokenizerPool:
    """Runs tokenizing work on at most `num_threads` threads; the rest waits in order."""

    def __init__(self, num_threads: int = DEFAULT_TOKENIZER_THREADS) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = num_threads
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenize")

    async def run(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(work, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
