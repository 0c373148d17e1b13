"""Backoff and crash-loop verdicts of `pagedserve serve`'s restarts (pure, no processes)."""

from __future__ import annotations

import pytest

from pagedserve.services.cli.restart_policy import CrashLoopError, RestartPolicy


def test_backoff_doubles_per_recent_death_up_to_the_cap() -> None:
    policy = RestartPolicy(max_deaths=10, base_delay_s=0.5, max_delay_s=3.0)
    delays = [policy.on_death("worker0", now=float(t)) for t in range(6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_the_fifth_death_within_the_window_is_a_crash_loop() -> None:
    policy = RestartPolicy(max_deaths=5, window_s=60)
    for t in range(4):
        policy.on_death("scheduler", now=10.0 * t)
    with pytest.raises(CrashLoopError, match="scheduler died 5 times within 60 s"):
        policy.on_death("scheduler", now=59.0)


def test_deaths_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy(max_deaths=3, window_s=60, base_delay_s=1.0)
    policy.on_death("redis", now=0.0)
    policy.on_death("redis", now=1.0)
    assert policy.on_death("redis", now=100.0) == 1.0  # the first two left the window
    assert policy.num_recent_deaths("redis", now=100.0) == 1


def test_children_are_counted_apart() -> None:
    policy = RestartPolicy(max_deaths=2)
    policy.on_death("gateway0", now=0.0)
    assert policy.on_death("gateway1", now=0.0) == policy.base_delay_s
    with pytest.raises(CrashLoopError):
        policy.on_death("gateway0", now=1.0)


@pytest.mark.parametrize(("field", "value"), [("max_deaths", 0), ("window_s", 0.0)])
def test_bad_bounds_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be"):
        RestartPolicy(**{field: value})
