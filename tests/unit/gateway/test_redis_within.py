"""A bounded Redis read answers at its bound, without waiting for the late call to unwind."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import RedisError

from services.gateway.engine_client import redis_within


def test_a_late_call_is_abandoned_not_awaited() -> None:
    unwound = asyncio.Event()

    async def stalled_call() -> int:
        try:
            await asyncio.sleep(60)  # Redis stopped
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # closing its connection takes a while too
            unwound.set()
            raise
        return 1

    async def main() -> bool:
        with pytest.raises(RedisError, match=r"no answer within 0\.05s"):
            await redis_within(stalled_call(), 0.05)
        was_unwound_when_answered = unwound.is_set()
        await asyncio.wait_for(unwound.wait(), 10)  # it still ends, by itself
        return was_unwound_when_answered

    assert asyncio.run(main()) is False


def test_a_prompt_call_returns_its_value() -> None:
    async def call() -> int:
        return 7

    assert asyncio.run(redis_within(call(), 1.0)) == 7
