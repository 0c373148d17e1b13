"""The one place a Redis client is made: from a plain URL, or through Redis Sentinel.

Every process of pagedserve reaches Redis through a `RedisTarget`: `--redis-url` alone names one
server; `--redis-sentinel HOST:PORT[,HOST:PORT...]/SERVICE` names the sentinels that watch the
primary of SERVICE, and the URL then gives only the database number and credentials. A client
made through sentinels asks them for the primary's address on every new connection, so a
connection that fails after a failover (the old primary died, or came back as a replica and
answers READONLY) is replaced by one to the promoted replica: callers see a `ConnectionError`
for the failed call, and the next call reaches the new primary.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.sentinel import Sentinel

from pagedserve.shared.config import RedisConfig

DEFAULT_REDIS_URL = RedisConfig().url
# How long one question to one sentinel may take: a sentinel host that is down must not hold
# up the search for the primary (the next sentinel is asked).
SENTINEL_TIMEOUT_S = 1.0
# What the primary's connections keep from the URL when sentinels give the address.
_URL_KEYS_KEPT = ("db", "username", "password")


@dataclass(frozen=True)
class SentinelAddress:
    """The sentinels to ask, and the name under which they monitor the primary."""

    hosts: tuple[tuple[str, int], ...]
    service_name: str

    @classmethod
    def parse(cls, text: str) -> SentinelAddress:
        """`HOST:PORT[,HOST:PORT...]/SERVICE`, or ValueError saying what is wrong."""
        hosts_text, slash, service_name = text.strip().rpartition("/")
        if not slash or not service_name or not hosts_text:
            raise ValueError(
                f"--redis-sentinel {text!r}: expected HOST:PORT[,HOST:PORT...]/SERVICE, "
                "e.g. 10.0.0.1:26379,10.0.0.2:26379/pagedserve"
            )
        return cls(tuple(_host_port(item) for item in hosts_text.split(",")), service_name)

    def __str__(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.hosts) + f"/{self.service_name}"


def _host_port(item: str) -> tuple[str, int]:
    host, colon, port = item.strip().rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--redis-sentinel: {item!r} is not HOST:PORT with a port in 1..65535")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class RedisTarget:
    """Where a process finds Redis: `url`, or the primary that `sentinel` names."""

    url: str = DEFAULT_REDIS_URL
    sentinel: SentinelAddress | None = None

    @classmethod
    def of(cls, url: str | None, sentinel: str | None = None) -> RedisTarget:
        """From the values of `--redis-url` and `--redis-sentinel` (ValueError if malformed)."""
        address = SentinelAddress.parse(sentinel) if sentinel else None
        return cls(url or DEFAULT_REDIS_URL, address)

    def describe(self) -> str:
        if self.sentinel is None:
            return self.url
        return f"the primary of {self.sentinel.service_name!r} (sentinels {self.sentinel})"


def _primary_kwargs(target: RedisTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    from_url = {k: v for k, v in parse_url(target.url).items() if k in _URL_KEYS_KEPT}
    return {**from_url, **kwargs}


def _sentinel_kwargs() -> dict[str, Any]:
    return {"socket_connect_timeout": SENTINEL_TIMEOUT_S, "socket_timeout": SENTINEL_TIMEOUT_S}


def sync_redis(target: RedisTarget, **kwargs: Any) -> redis.Redis:
    """A blocking client (the CLI, probes); `kwargs` as for `redis.Redis`."""
    if target.sentinel is None:
        return redis.Redis.from_url(target.url, **kwargs)
    sentinel = Sentinel(list(target.sentinel.hosts), sentinel_kwargs=_sentinel_kwargs())
    return sentinel.master_for(target.sentinel.service_name, **_primary_kwargs(target, kwargs))


class _ClosedTransportIsConnectionError:
    """A command written to a connection whose transport is closed fails with `ConnectionError`.

    Under uvloop (the gateway's loop: uvicorn picks it) writing to a transport that is already
    closed raises `RuntimeError("unable to perform operation on <TCPTransport closed=True ...>;
    the handler is closed")`, where asyncio's own loop raises an `OSError` that redis-py turns
    into a `ConnectionError`. It happens when Redis dies, or is restarted, between a connect and
    its first command. redis-py disconnects and lets the `RuntimeError` through, past its retry
    and past every caller's `except RedisError`: the gateway's output reader died of it, and
    with it every stream of that gateway (seen once in ~40 Redis kills under load)."""

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]
        except RuntimeError as exc:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc


@cache
def _closed_transport_safe(connection_class: type) -> type:
    """`connection_class` with `_ClosedTransportIsConnectionError` in front."""
    name = f"ClosedTransportSafe{connection_class.__name__}"
    return type(name, (_ClosedTransportIsConnectionError, connection_class), {})


def _closed_transport_safe_client(client: aioredis.Redis) -> aioredis.Redis:
    """`client`, its pool making `_ClosedTransportIsConnectionError` connections (set before
    the pool makes its first connection, whichever class the URL or the sentinels chose)."""
    pool = client.connection_pool
    pool.connection_class = _closed_transport_safe(pool.connection_class)
    return client


def async_redis(target: RedisTarget, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client with redis-py's default pool; `kwargs` as for `redis.asyncio.Redis`."""
    if target.sentinel is None:
        return _closed_transport_safe_client(aioredis.Redis.from_url(target.url, **kwargs))
    sentinel = AsyncSentinel(list(target.sentinel.hosts), sentinel_kwargs=_sentinel_kwargs())
    client = sentinel.master_for(target.sentinel.service_name, **_primary_kwargs(target, kwargs))
    return _closed_transport_safe_client(client)


class _BlockingSentinelPool(AsyncSentinelPool, aioredis.BlockingConnectionPool):
    """Connections to the sentinels' primary, callers beyond `max_connections` waiting for a
    free one (redis-py's sentinel pool would fail them with "Too many connections")."""


def async_redis_blocking_pool(
    target: RedisTarget, max_connections: int, pool_timeout_s: float, **kwargs: Any
) -> aioredis.Redis:
    """An asyncio client whose pool makes callers wait up to `pool_timeout_s` for one of its
    `max_connections` connections (the gateway's: a burst of requests queues, not fails)."""
    if target.sentinel is None:
        pool = aioredis.BlockingConnectionPool.from_url(
            target.url, max_connections=max_connections, timeout=pool_timeout_s, **kwargs
        )
        return _closed_transport_safe_client(aioredis.Redis.from_pool(pool))
    sentinel = AsyncSentinel(list(target.sentinel.hosts), sentinel_kwargs=_sentinel_kwargs())
    pool = _BlockingSentinelPool(
        target.sentinel.service_name,
        sentinel,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        **_primary_kwargs(target, kwargs),
    )
    return _closed_transport_safe_client(aioredis.Redis.from_pool(pool))
