"""A worker that cannot sample a sequence yet (its grammar is compiling) defers it: the
scheduler runs its last token again next step, and nothing else waits. A grammar that fails
to compile fails its request as the request's fault (invalid_request), not the engine's."""

from __future__ import annotations

from pagedserve.shared.protocol import ERROR_INVALID_REQUEST, StepResult
from tests.unit.scheduler.helpers import make_request, make_scheduler


def test_a_deferred_sequence_reruns_its_last_token_and_others_keep_going():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("slow", 5))
    scheduler.add_request(make_request("fast", 5))
    plan = scheduler.schedule()
    result = StepResult(plan.step_id, ["fast"], [7], deferred_seq_ids=["slow"])
    deltas = scheduler.update_from_output(plan, result)
    assert [d.request_id for d in deltas] == ["fast"]  # no error, no token for "slow"

    plan = scheduler.schedule()
    cached = {s.seq_id: s for s in plan.cached_seqs}
    assert cached["slow"].num_computed_tokens == 4 and cached["slow"].num_scheduled_tokens == 1
    assert cached["slow"].new_token_ids == []  # the worker already holds every token
    assert cached["fast"].new_token_ids == [7]
    deltas = scheduler.update_from_output(plan, StepResult(plan.step_id, ["slow", "fast"], [8, 9]))
    assert {d.request_id: d.token_ids for d in deltas} == {"slow": [8], "fast": [9]}
    scheduler.check_integrity()


def test_a_grammar_error_fails_only_its_request_as_invalid():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("bad", 5))
    scheduler.add_request(make_request("good", 5))
    plan = scheduler.schedule()
    result = StepResult(plan.step_id, ["good"], [7], seq_errors={"bad": "invalid regex: (("})
    deltas = {d.request_id: d for d in scheduler.update_from_output(plan, result)}
    assert deltas["bad"].finish_reason == "error"
    assert deltas["bad"].error == "invalid regex: (("
    assert deltas["bad"].error_code == ERROR_INVALID_REQUEST
    assert deltas["good"].token_ids == [7] and not deltas["good"].finished
    assert scheduler.get_request("bad") is None
    scheduler.check_integrity()
