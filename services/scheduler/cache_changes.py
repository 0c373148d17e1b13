"""The prefix cache's changes since they were last published: block digests cached and
evicted, netted (a block cached then evicted before a publish is not sent at all).

The block pool records into it as it caches and evicts; `cache_publisher.py` takes the changes
each publish interval and sends them to Redis. It holds at most `limit` digests: past that
(nobody published for a long while, e.g. an engine without a publisher) it forgets them and
says `needs_full`, so that the next publish sends the whole cache instead. Memory stays bounded
and nothing is missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CacheDelta:
    """What to send: digests now cached, digests no longer cached, or (needs_full) neither
    list but the whole cache."""

    added: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    needs_full: bool = False


class CacheChangeLog:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._changes: dict[bytes, bool] = {}  # digest -> cached now
        self._needs_full = True  # nothing published yet

    def cached(self, block_hash: bytes) -> None:
        self._record(block_hash, True)

    def evicted(self, block_hash: bytes) -> None:
        self._record(block_hash, False)

    def cleared(self) -> None:
        """Every cached block was forgotten at once (a prefix-cache reset)."""
        self._changes.clear()
        self._needs_full = True

    def take(self) -> CacheDelta:
        """The changes since the last take, leaving the log empty."""
        if self._needs_full:
            self._changes.clear()
            self._needs_full = False
            return CacheDelta(needs_full=True)
        changes, self._changes = self._changes, {}
        added = [h for h, now_cached in changes.items() if now_cached]
        removed = [h for h, now_cached in changes.items() if not now_cached]
        return CacheDelta(added, removed)

    def _record(self, block_hash: bytes, now_cached: bool) -> None:
        if self._needs_full:
            return  # the next publish sends the whole cache anyway
        self._changes[block_hash] = now_cached
        if len(self._changes) > self.limit:
            self.cleared()
