"""Publishes what this engine's prefix cache holds, for the gateways to route by cache
(`shared/cache_summary.py` has the format, `services/gateway/router.py` the reader).

Every `PUBLISH_INTERVAL_S` the digests cached and evicted since the last publish are sent as
one SADD and one SREM in one MULTI/EXEC with the set's TTL refreshed: the cost is bounded by
how many blocks changed in the interval, not by the cache's size, and it is one Redis round trip
at most per interval whatever the step rate. The whole set is sent again (DEL + SADD) only when
the increments cannot be trusted: at start, after a prefix-cache reset (the workers restarted),
after a failed publish (the delta taken is gone), when the change log overflowed, or when the set
vanished (Redis restarted, or the TTL ran out while the engine was stalled).

Staleness: a block is visible to the gateways at most `PUBLISH_INTERVAL_S` (plus one write)
after the step that cached it; an eviction likewise. The summary is a hint and nothing more:
a gateway misled by it routes a request to an engine that then computes the prefix itself.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.shared.cache_summary import CACHE_SUMMARY_TTL_S, summary_member
from pagedserve.shared.keys import RedisKeys

logger = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 0.1
REFRESH_TTL_EVERY_S = CACHE_SUMMARY_TTL_S / 3  # with no change, the TTL is refreshed this often
FULL_CHUNK = 10_000  # members per SADD of a full publish


class CachePublisher:
    def __init__(
        self, redis: aioredis.Redis, keys: RedisKeys, engine_id: str, kv: KVCacheManager
    ) -> None:
        self._redis = redis
        self._key = keys.cache_summary(engine_id)
        self._kv = kv
        self._needs_full = True
        self._refreshed_at = 0.0  # monotonic time of the last TTL refresh
        self.num_published = 0  # members sent, for tests and logs

    async def publish_forever(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.publish_once()
            except RedisError as exc:
                self._needs_full = True  # the delta taken is lost with the write
                logger.warning("publishing the cache summary failed: %s", exc)
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    async def publish_once(self) -> None:
        delta = self._kv.take_cache_changes()
        if delta.needs_full or self._needs_full:
            await self._publish_full()
            return
        if delta.added or delta.removed:
            async with self._redis.pipeline(transaction=True) as pipe:
                if delta.added:
                    pipe.sadd(self._key, *map(summary_member, delta.added))
                if delta.removed:
                    pipe.srem(self._key, *map(summary_member, delta.removed))
                pipe.expire(self._key, CACHE_SUMMARY_TTL_S)
                await pipe.execute()
            self.num_published += len(delta.added) + len(delta.removed)
            self._refreshed_at = time.monotonic()
        elif time.monotonic() - self._refreshed_at > REFRESH_TTL_EVERY_S:
            still_there = await self._redis.expire(self._key, CACHE_SUMMARY_TTL_S)
            self._refreshed_at = time.monotonic()
            if not still_there and self._kv.cached_block_hashes():
                await self._publish_full()

    async def withdraw(self) -> None:
        """This engine stops: its KV is about to be gone, so no gateway should route by it."""
        await self._redis.delete(self._key)

    async def _publish_full(self) -> None:
        members = [summary_member(h) for h in self._kv.cached_block_hashes()]  # one snapshot
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key)
            for start in range(0, len(members), FULL_CHUNK):
                pipe.sadd(self._key, *members[start : start + FULL_CHUNK])
            pipe.expire(self._key, CACHE_SUMMARY_TTL_S)
            await pipe.execute()
        self._needs_full = False
        self.num_published += len(members)
        self._refreshed_at = time.monotonic()
