from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import RedisServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(free_port()) as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield client
    client.close()
