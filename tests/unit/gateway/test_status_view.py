"""The gateway's status view: /health answers from it without waiting on Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from pagedserve.services.gateway import status_view
from pagedserve.services.gateway.status_view import EngineStatusView
from pagedserve.shared.status import EngineStatus


class FakeClient:
    """Answers like EngineClient's two reads; `stall` holds them, `fail` raises."""

    def __init__(self) -> None:
        self.stall = asyncio.Event()
        self.stall.set()
        self.fail = False
        self.unreadable = False

    async def engine_statuses(self) -> list[EngineStatus]:
        await self.stall.wait()
        if self.fail:
            raise RedisConnectionError("Connection refused")
        if self.unreadable:
            raise ValueError("field time: 'soon' is not a number")
        return [EngineStatus(engine_id="e0", time=time.time(), workers_alive=True)]

    async def process_restarts(self) -> dict[str, int]:
        return {"worker0": 1}


def view_of(client: FakeClient) -> EngineStatusView:
    return EngineStatusView(client.engine_statuses, client.process_restarts)


def test_the_view_serves_the_last_good_read() -> None:
    async def main() -> None:
        view = view_of(FakeClient())
        await view.refresh()
        snapshot = await view.current()
        assert [s.engine_id for s in snapshot.statuses] == ["e0"]
        assert snapshot.process_restarts == {"worker0": 1}

    asyncio.run(main())


def test_a_failed_read_is_reported_until_a_good_one() -> None:
    async def main() -> None:
        client = FakeClient()
        view = view_of(client)
        await view.refresh()
        client.fail = True
        await view.refresh()
        with pytest.raises(RedisError, match="Connection refused"):
            await view.current()
        client.fail = False
        await view.refresh()
        assert (await view.current()).statuses

    asyncio.run(main())


def test_a_stalled_read_is_reported_at_once_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_view, "STALL_AFTER_S", 0.05)

    async def main() -> None:
        client = FakeClient()
        view = view_of(client)
        await view.refresh()
        client.stall.clear()  # Redis stopped (SIGSTOP)
        reader = asyncio.create_task(view.refresh())
        await asyncio.sleep(0)
        assert (await view.current()).statuses  # within the bound: the last read stands
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(RedisError, match="no answer for"):
            await view.current()
        assert time.monotonic() - started < 0.05  # no I/O on the probe's path
        client.stall.set()
        await reader
        assert (await view.current()).statuses

    asyncio.run(main())


def test_a_probe_before_the_first_read_waits_briefly_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_view, "FIRST_READ_WAIT_S", 0.05)

    async def main() -> None:
        client = FakeClient()
        client.stall.clear()
        view = view_of(client)
        reader = asyncio.create_task(view.refresh())
        with pytest.raises(RedisError, match="no answer"):
            await view.current()
        client.stall.set()
        await reader
        assert (await view.current()).statuses

    asyncio.run(main())


def test_an_unreadable_record_is_reported_and_the_view_lives_on() -> None:
    async def main() -> None:
        client = FakeClient()
        view = view_of(client)
        client.unreadable = True
        await view.refresh()
        with pytest.raises(RedisError, match="unreadable engine status: field time"):
            await view.current()
        client.unreadable = False
        await view.refresh()
        assert (await view.current()).statuses

    asyncio.run(main())
