"""Clients made by `shared/redis_client.py` through real sentinels on loopback: they reach the
primary, and after a failover (ordered, or the primary killed) the next call reaches the
promoted replica. The whole-system failover under load is tests/multihost."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from pagedserve.services.cli.queue_reader import QueueError, connect
from pagedserve.shared.redis_client import (
    RedisTarget,
    async_redis,
    async_redis_blocking_pool,
    sync_redis,
)
from tests.fixtures.redis_sentinel import (
    SERVICE_NAME,
    redis_argv,
    sentinel_argv,
    sentinel_option,
)
from tests.integration.conftest import free_port, redis_server_binary
from tests.integration.processes import wait_for

LOOPBACK = "127.0.0.1"


class SentinelSet:
    """A primary, one replica and one sentinel (quorum 1) on loopback."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pagedserve-sentinel-"))
        self.ports = {"primary": free_port(), "replica": free_port(), "sentinel": free_port()}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> SentinelSet:
        binary = redis_server_binary()
        primary = (LOOPBACK, self.ports["primary"])
        argvs = {
            "primary": redis_argv(binary, [LOOPBACK], primary[1], self.dir, None),
            "replica": redis_argv(binary, [LOOPBACK], self.ports["replica"], self.dir, primary),
            "sentinel": sentinel_argv(
                binary, LOOPBACK, self.ports["sentinel"], self.dir, primary, quorum=1
            ),
        }
        for name, argv in argvs.items():
            self.processes[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        wait_for("the replica in sync", self.replica_in_sync, 20)
        wait_for("the sentinel seeing the replica", self.sentinel_sees_replica, 20)
        return self

    def order_failover(self, timeout_s: float = 60) -> None:
        """SENTINEL FAILOVER, repeated while the sentinel finds no promotable replica yet
        (NOGOODSLAVE: it has not had the replica's own INFO, which it asks every 10 s)."""

        def accepted() -> bool:
            try:
                self.client("sentinel").execute_command("SENTINEL", "FAILOVER", SERVICE_NAME)
            except redis.ResponseError as error:
                if "NOGOODSLAVE" not in str(error):
                    raise
                return False
            return True

        wait_for("the sentinel accepting the failover", accepted, timeout_s)

    @property
    def option(self) -> str:
        return sentinel_option([(LOOPBACK, self.ports["sentinel"])])

    def client(self, name: str) -> redis.Redis:
        return redis.Redis(LOOPBACK, self.ports[name], socket_timeout=2)

    def replica_in_sync(self) -> bool:
        try:
            return self.client("replica").info("replication")["master_link_status"] == "up"
        except (redis.RedisError, KeyError):
            return False

    def sentinel_sees_replica(self) -> bool:
        """The sentinel lists the replica, connected and with its link to the primary up."""
        replicas = self.client("sentinel").sentinel_slaves(SERVICE_NAME)
        return any(
            r["port"] == self.ports["replica"]
            and not r.get("is_disconnected")
            and r.get("master-link-status") == "ok"
            for r in replicas
        )

    def swapped(self) -> bool:
        """The sentinel names the replica as primary, and the old primary follows it."""
        old_role = self.client("primary").info("replication")["role"]
        return self.primary_port() == self.ports["replica"] and old_role == "slave"

    def primary_port(self) -> int:
        return int(self.client("sentinel").sentinel_master(SERVICE_NAME)["port"])

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    cluster = SentinelSet()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _port_of(client: redis.Redis) -> int:
    return int(client.config_get("port")["port"])


def test_clients_reach_the_primary_through_the_sentinel(sentinels: SentinelSet) -> None:
    target = RedisTarget.of("redis://ignored:1/2", sentinels.option)
    client = sync_redis(target, socket_timeout=2)
    client.set("k", "v")
    assert _port_of(client) == sentinels.ports["primary"]
    in_db_2 = redis.Redis(LOOPBACK, sentinels.ports["primary"], db=2)  # the URL's db
    assert in_db_2.get("k") == b"v"
    queue_client = connect("redis://ignored:1/0", sentinels.option)
    assert _port_of(queue_client) == sentinels.ports["primary"]

    async def through_async_clients() -> list[bytes | None]:
        plain = async_redis(target)
        blocking = async_redis_blocking_pool(target, max_connections=2, pool_timeout_s=5)
        values = [await plain.get("k"), await blocking.get("k")]
        await plain.aclose()
        await blocking.aclose()
        return values

    assert asyncio.run(through_async_clients()) == [b"v", b"v"]


def test_a_sentinel_nobody_answers_is_a_clear_error() -> None:
    with pytest.raises(QueueError, match="cannot reach Redis at the primary of 'pagedserve'"):
        connect("redis://x:1/0", sentinel_option([(LOOPBACK, free_port())]))
    with pytest.raises(QueueError, match="--redis-sentinel"):
        connect("redis://x:1/0", "no-port/pagedserve")


def test_clients_follow_an_ordered_failover(sentinels: SentinelSet) -> None:
    """The old primary comes back as a replica: a pooled connection to it answers READONLY,
    which the client turns into a ConnectionError and a fresh connection to the new primary."""
    target = RedisTarget.of(None, sentinels.option)

    async def scenario() -> None:
        client = async_redis_blocking_pool(
            target, max_connections=4, pool_timeout_s=5, socket_timeout=2
        )
        await client.set("before", 1)
        await asyncio.to_thread(sentinels.order_failover)
        await asyncio.to_thread(wait_for, "the old primary demoted", sentinels.swapped, 30)
        await _write_until_accepted(client, "after")
        assert int((await client.config_get("port"))["port"]) == sentinels.ports["replica"]
        assert await client.get("before") == b"1"  # replicated before the failover
        await client.aclose()

    asyncio.run(scenario())


def test_clients_follow_a_killed_primary(sentinels: SentinelSet) -> None:
    target = RedisTarget.of(None, sentinels.option)

    async def scenario() -> int:
        client = async_redis(target, socket_timeout=2, socket_connect_timeout=1)
        await client.set("before", 1)
        sentinels.processes["primary"].kill()
        num_failed = await _write_until_accepted(client, "after", timeout_s=60)
        assert int((await client.config_get("port"))["port"]) == sentinels.ports["replica"]
        await client.aclose()
        return num_failed

    assert asyncio.run(scenario()) >= 1  # the dead primary's calls failed, then it moved on


async def _write_until_accepted(client, key: str, timeout_s: float = 30) -> int:
    """SET `key` until it succeeds; the number of calls that failed with ConnectionError."""
    num_failed = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await client.set(key, 1)
            return num_failed
        except RedisConnectionError:
            num_failed += 1
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)
