"""How often `pagedserve serve` restarted each child, published in Redis so that every gateway's
/metrics shows it (`pagedserve:process_restarts_total{process=...}`).

The whole hash is rewritten on each publish: a restarted Redis (no persistence) has lost it,
and serve is the only writer of its namespace's hash. A publish that fails (Redis is the child
being restarted) stays pending and is retried on the next `publish_pending`.
"""

from __future__ import annotations

import logging
from collections import Counter

import redis

from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.redis_client import RedisTarget, sync_redis

logger = logging.getLogger(__name__)


class RestartCounts:
    def __init__(self, redis_url: str, namespace: str) -> None:
        self.redis_url = redis_url
        self.key = RedisKeys(namespace).process_restarts
        self.counts: Counter[str] = Counter()
        self.pending = True  # the first publish clears a previous serve's counts

    def add(self, name: str) -> None:
        self.counts[name] += 1
        self.pending = True

    def publish_pending(self) -> bool:
        """Write the counts if they changed since the last success; False if Redis failed."""
        if not self.pending:
            return True
        client = sync_redis(
            RedisTarget(self.redis_url), socket_connect_timeout=0.5, socket_timeout=0.5
        )
        try:
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(self.key)
                if self.counts:
                    pipe.hset(self.key, mapping=dict(self.counts))
                pipe.execute()
        except redis.RedisError as exc:
            logger.debug("restart counts not published yet: %s", exc)
            return False
        finally:
            client.close()
        self.pending = False
        return True
