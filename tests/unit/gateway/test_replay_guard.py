"""ReplayGuard: tokens replayed after an engine restart are shown once, or the choice fails."""

from __future__ import annotations

import pytest

from pagedserve.services.gateway.replay_guard import ReplayGuard, ReplayMismatch
from pagedserve.shared.protocol import TokenDelta


def delta(token_ids: list[int], total: int, **fields: object) -> TokenDelta:
    return TokenDelta("r-0", token_ids, num_output_tokens=total, **fields)  # type: ignore[arg-type]


def run(guard: ReplayGuard, deltas: list[TokenDelta]) -> list[int]:
    shown: list[int] = []
    for d in deltas:
        shown += guard.admit(d).token_ids
    return shown


def test_a_replay_from_the_prompt_shows_each_token_once() -> None:
    guard = ReplayGuard()
    before = [delta([5], 1), delta([6], 2), delta([7], 3)]
    replay = [delta([5], 1), delta([6, 7], 3), delta([8], 4), delta([9], 5, finish_reason="length")]
    assert run(guard, before + replay) == [5, 6, 7, 8, 9]
    assert guard.num_replayed_tokens == 3


def test_a_partly_replayed_delta_keeps_only_its_new_tail_and_its_logprobs() -> None:
    guard = ReplayGuard()
    run(guard, [delta([1, 2], 2)])
    out = guard.admit(delta([1, 2, 3], 3, logprobs=[-0.1, -0.2, -0.3]))
    assert out.token_ids == [3] and out.logprobs == [-0.3]


def test_a_stop_token_counts_as_a_position_without_being_shown() -> None:
    guard = ReplayGuard()
    run(guard, [delta([1], 1), delta([2], 2)])
    final = guard.admit(delta([], 3, finish_reason="stop", stop_token_id=0))
    assert final.token_ids == [] and final.finish_reason == "stop"
    assert guard.shown_token_ids == [1, 2]


def test_a_replay_that_disagrees_with_what_was_shown_is_an_error() -> None:
    guard = ReplayGuard()
    run(guard, [delta([1], 1), delta([2], 2)])
    with pytest.raises(ReplayMismatch, match="regenerated different tokens"):
        guard.admit(delta([1, 9], 2))


def test_a_replay_that_stops_before_the_shown_text_ends_is_an_error() -> None:
    guard = ReplayGuard()
    run(guard, [delta([1, 2, 3], 3)])
    with pytest.raises(ReplayMismatch, match="stopped earlier"):
        guard.admit(delta([1], 2, finish_reason="stop", stop_token_id=0))


def test_a_gap_in_positions_is_an_error() -> None:
    guard = ReplayGuard()
    run(guard, [delta([1], 1)])
    with pytest.raises(ReplayMismatch, match="never arrived"):
        guard.admit(delta([4], 4))


def test_deltas_without_tokens_pass_untouched() -> None:
    guard = ReplayGuard()
    run(guard, [delta([1, 2], 2)])
    aborted = delta([], 0, finish_reason="abort")
    assert guard.admit(aborted) is aborted


def test_deltas_without_position_counts_are_passed_on_in_order() -> None:
    guard = ReplayGuard()
    assert run(guard, [delta([1, 2], 0), delta([3], 0)]) == [1, 2, 3]
