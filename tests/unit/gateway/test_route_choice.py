from __future__ import annotations

import pytest

from pagedserve.services.gateway.recent_routes import RecentRoutes
from pagedserve.services.gateway.route_choice import (
    BALANCE_ABS,
    REASON_CACHE,
    REASON_LOAD,
    REASON_SHARED,
    Candidate,
    Choice,
    choose,
    is_overloaded,
)


def engine(engine_id: str, load: int = 0, hit_tokens: int = 0, free: int = 100) -> Candidate:
    return Candidate(engine_id, load, free, hit_tokens)


def test_cache_picks_the_longest_cached_prefix() -> None:
    choice = choose("cache", [engine("a", hit_tokens=64), engine("b", hit_tokens=128, load=3)])
    assert choice == Choice("b", REASON_CACHE, 128)


def test_cache_without_any_hit_goes_to_the_least_loaded() -> None:
    choice = choose("cache", [engine("a", load=5), engine("b", load=2)])
    assert choice == Choice("b", REASON_LOAD)


def test_cache_skips_an_overloaded_engine_however_much_it_holds() -> None:
    busy = engine("a", load=BALANCE_ABS + 10, hit_tokens=2048)
    idle = engine("b", load=2, hit_tokens=16)
    assert choose("cache", [busy, idle]) == Choice("b", REASON_CACHE, 16)
    assert choose("cache", [busy, engine("b", load=2)]) == Choice("b", REASON_LOAD)


def test_overload_needs_both_the_absolute_and_the_relative_gap() -> None:
    assert not is_overloaded(BALANCE_ABS, 0)  # not more than ABS above
    assert is_overloaded(BALANCE_ABS + 1, 0)
    assert not is_overloaded(100 + BALANCE_ABS + 1, 100)  # under 1.5x the least loaded
    assert is_overloaded(200, 100)


def test_load_ignores_the_cache_and_breaks_ties_by_free_blocks() -> None:
    candidates = [engine("a", load=1, hit_tokens=512), engine("b", load=1, free=200)]
    assert choose("load", candidates) == Choice("b", REASON_LOAD)


def test_shared_and_no_live_engine_go_to_the_shared_stream() -> None:
    assert choose("shared", [engine("a")]) == Choice(None, REASON_SHARED)
    assert choose("cache", []) == Choice(None, REASON_SHARED)
    with pytest.raises(ValueError, match="unknown routing policy 'nearest'"):
        choose("nearest", [engine("a")])


def test_recent_routes_expire_and_stay_bounded() -> None:
    recent = RecentRoutes(ttl_s=10, capacity=3)
    recent.record("a", [b"x", b"y"], now=100.0)
    assert recent.was_sent("a", b"x", now=109.0) and not recent.was_sent("b", b"x", now=109.0)
    assert not recent.was_sent("a", b"x", now=111.0)
    recent.record("b", [b"z", b"w"], now=105.0)
    assert len(recent) == 3 and not recent.was_sent("a", b"x", now=106.0)  # oldest went
