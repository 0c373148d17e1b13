"""What an engine publishes of its prefix cache, for the gateways to route by: the format both
sides agree on.

The summary of engine E is a Redis set at `RedisKeys.cache_summary(E)` whose members are the
first `MEMBER_BYTES` bytes of the SHA-256 digest (`block_hash.py`) of each full block E holds
in its prefix cache. Eight bytes are plenty for routing: a collision only sends a request to
an engine that then misses the cache and computes the prefix (correctness never depends on the
summary; the engine checks the full 32-byte digest). The set expires `CACHE_SUMMARY_TTL_S`
after the last publish, so a dead engine's summary disappears with its status record.
"""

from __future__ import annotations

from pagedserve.shared.status import ENGINE_STATUS_TTL_S

MEMBER_BYTES = 8
CACHE_SUMMARY_TTL_S = ENGINE_STATUS_TTL_S
ROUTING_POLICIES = ("cache", "load", "shared")


def summary_member(block_hash: bytes) -> bytes:
    """The set member that stands for one cached block."""
    return block_hash[:MEMBER_BYTES]
