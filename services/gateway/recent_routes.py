"""What this gateway routed recently: the prompt blocks it sent to each engine, for a short
while, so that the requests of one prefix that arrive together follow the first.

The engine's published summary shows a prefix only once a step has computed it (a 2k-token
prefix takes several steps) and the next publish has run; requests of the same tenant arriving
meanwhile would find no engine holding it and be spread by load, each computing the prefix
again. Remembering where the first went closes that gap (SGLang's router keeps such a tree of
routed prompts). The memory is a guess: an entry lives `TTL_S`, enough for the engine to compute
and publish the prefix, and the map holds at most `capacity` blocks (least recently used go).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

TTL_S = 10.0
CAPACITY = 100_000  # (engine, block) pairs: about 10 MB at most


class RecentRoutes:
    def __init__(self, ttl_s: float = TTL_S, capacity: int = CAPACITY) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._sent_at: OrderedDict[tuple[str, bytes], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sent_at)

    def record(self, engine_id: str, members: Sequence[bytes], now: float | None = None) -> None:
        """`engine_id` was sent a prompt whose blocks are `members` (summary members)."""
        now = time.monotonic() if now is None else now
        for member in members:
            key = (engine_id, member)
            self._sent_at[key] = now
            self._sent_at.move_to_end(key)
        while len(self._sent_at) > self.capacity:
            self._sent_at.popitem(last=False)

    def was_sent(self, engine_id: str, member: bytes, now: float) -> bool:
        sent_at = self._sent_at.get((engine_id, member))
        return sent_at is not None and now - sent_at <= self.ttl_s
