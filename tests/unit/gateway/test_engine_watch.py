"""The engine-loss clock counts only time in which Redis answered promptly."""

from __future__ import annotations

import pytest

from pagedserve.services.gateway.engine_watch import SLOW_READ_S, EngineLossClock


def test_dead_time_accumulates_between_good_reads() -> None:
    clock = EngineLossClock()
    clock.record_read(0.0, 0.1, any_live=False)
    clock.record_read(2.0, 2.1, any_live=False)
    clock.record_read(4.0, 4.1, any_live=False)
    assert clock.num_dead_s == pytest.approx(4.0)


def test_a_failed_read_stops_the_clock_without_resetting_it() -> None:
    clock = EngineLossClock()
    clock.record_read(0.0, 0.1, any_live=False)
    clock.record_read(2.0, 2.1, any_live=False)  # 2 s seen dead
    clock.record_read(4.0, 9.0, any_live=None)  # Redis down: blind
    clock.record_read(60.0, 60.1, any_live=False)  # back after a long outage: counts 0
    assert clock.num_dead_s == pytest.approx(2.0)
    clock.record_read(62.0, 62.1, any_live=False)
    assert clock.num_dead_s == pytest.approx(4.0)


def test_a_slow_read_is_blindness() -> None:
    clock = EngineLossClock()
    clock.record_read(0.0, 0.1, any_live=False)
    clock.record_read(2.0, 2.0 + SLOW_READ_S + 0.5, any_live=False)  # Redis stalled
    clock.record_read(30.0, 30.1, any_live=False)
    assert clock.num_dead_s == pytest.approx(0.0)


def test_a_live_engine_resets_the_clock() -> None:
    clock = EngineLossClock()
    clock.record_read(0.0, 0.1, any_live=False)
    clock.record_read(2.0, 2.1, any_live=False)
    clock.record_read(4.0, 4.1, any_live=True)
    clock.record_read(6.0, 6.1, any_live=False)
    assert clock.num_dead_s == pytest.approx(0.0)
