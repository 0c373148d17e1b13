"""Async scheduling: a step planned while the previous one computes runs each plain decoding
sequence on the token still being sampled, and every output stays what a step-by-step run
gives. The fake worker checks every position's KV and runs a deterministic "model" (the next
token is a function of all tokens before it), so outputs must match exactly."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest

from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.protocol import GenerateRequest, StepPlan, StructuredOutput
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler

END = 2


def model(tokens: list[int]) -> int:
    """The next token; the end token now and then."""
    h = (sum(tokens[-3:]) * 31 + len(tokens) * 7) % 97
    return END if h % 11 == 0 else 3 + h


def workload() -> dict[int, list[GenerateRequest]]:
    """Requests by the step they arrive at: long and short prompts (chunked in 16-token
    steps; some repeat themselves, so n-gram drafts find matches), lengths from 1 to 24
    tokens, most ending at the end token; greedy."""
    arrivals: dict[int, list[GenerateRequest]] = defaultdict(list)
    for i in range(14):
        period = 50 if i % 3 else 4
        prompt = [10 + (i * 7 + j) % period for j in range(3 + (i * 5) % 29)]
        request = make_request(
            f"r{i}", prompt, max_tokens=1 + (i * 5) % 24, eos_token_ids=(END,),
            ignore_eos=i % 4 == 0, temperature=0.0,
        )  # fmt: skip
        arrivals[(i * 3) % 11].append(request)
    return arrivals


def scheduler(
    async_scheduling: bool, num_blocks: int = 20, num_speculative_tokens: int = 0
) -> tuple[Scheduler, FakeWorker]:
    s = make_scheduler(
        num_blocks=num_blocks, block_size=4, max_num_seqs=6, max_num_batched_tokens=16,
        max_model_len=64, async_scheduling=async_scheduling,
        num_speculative_tokens=num_speculative_tokens, speculative_max_num_seqs=6,
    )  # fmt: skip
    return s, FakeWorker(num_blocks, 4)


def drive(
    s: Scheduler, worker: FakeWorker, arrivals, ahead: bool, next_token=model
) -> tuple[dict, list[StepPlan]]:
    """The step loop's order: plan until two plans are out (ahead of the last result, when
    allowed), then apply the oldest result; the worker runs plans in the order they were made.
    Returns the outputs and the plans made ahead."""
    outputs: dict[str, list] = defaultdict(list)
    plans_ahead: list[StepPlan] = []
    in_flight: deque[StepPlan] = deque()
    last_arrival = max(arrivals)
    for tick in range(2000):
        for request in arrivals.get(tick, []):
            s.add_request(request)
        while len(in_flight) < 2 and (not in_flight or (ahead and s.can_plan_ahead())):
            plan = s.schedule(plan_ahead=bool(in_flight))
            s.check_integrity()
            if plan.is_empty and not (plan.finished_seq_ids or plan.preempted_seq_ids):
                break
            if in_flight:
                plans_ahead.append(plan)
            in_flight.append(plan)
        if not in_flight:
            if tick > last_arrival and not s.has_unfinished_requests():
                break
            continue
        plan = in_flight.popleft()
        for delta in s.update_from_output(plan, worker.execute_model(plan, next_token)):
            outputs[delta.request_id] += delta.token_ids
            if delta.finished:
                outputs[delta.request_id].append(delta.finish_reason)
        s.check_integrity()
    assert not s.has_unfinished_requests() and not in_flight
    assert s.kv.num_free_blocks == s.num_blocks, "blocks leaked"
    return dict(outputs), plans_ahead


def planned_on_samples_in_flight(plans_ahead: list[StepPlan]) -> int:
    """Sequences that plans made ahead ran on a sample still in flight."""
    return sum(
        1
        for plan in plans_ahead
        for seq in plan.cached_seqs
        if seq.keep_sample and not seq.new_token_ids and seq.num_scheduled_tokens == 1
    )


@pytest.mark.parametrize("num_blocks", [64, 20])  # 20: preemptions
def test_planning_ahead_gives_every_output_a_step_by_step_run_gives(num_blocks):
    reference, none_ahead = drive(*scheduler(False, num_blocks), workload(), ahead=True)
    kept, _ = drive(*scheduler(True, num_blocks), workload(), ahead=False)
    s, worker = scheduler(True, num_blocks)
    ahead, plans_ahead = drive(s, worker, workload(), ahead=True)
    assert none_ahead == []  # without async scheduling nothing is planned ahead
    assert kept == reference  # samples kept, steps one after the other
    assert ahead == reference
    assert len(reference) == 14 and all(o[-1] in ("stop", "length") for o in reference.values())
    assert len(plans_ahead) > 10
    assert planned_on_samples_in_flight(plans_ahead) > 20
    if num_blocks == 20:
        assert s.stats().num_preemptions > 0


def test_a_plan_made_ahead_sends_nothing_and_runs_the_token_being_sampled():
    s, worker = scheduler(True)
    s.add_request(make_request("a", 5, max_tokens=10, ignore_eos=True))
    first = s.schedule()
    assert first.new_seqs[0].keep_sample
    assert s.can_plan_ahead()
    second = s.schedule(plan_ahead=True)
    [seq] = second.cached_seqs
    assert (seq.new_token_ids, seq.num_computed_tokens, seq.num_scheduled_tokens) == ([], 5, 1)
    assert seq.keep_sample
    assert s.get_request("a").kept_sample_steps == [first.step_id, second.step_id]
    assert not s.can_plan_ahead() or not s.schedule(plan_ahead=True).cached_seqs  # one ahead
    first_delta = s.update_from_output(first, worker.execute_model(first, model))
    second_delta = s.update_from_output(second, worker.execute_model(second, model))
    request = s.get_request("a")
    assert request.output_token_ids == first_delta[0].token_ids + second_delta[0].token_ids
    assert request.num_sent_tokens == request.num_tokens  # the worker holds both already
    third = s.schedule()
    assert third.cached_seqs[0].new_token_ids == []


def test_no_plan_runs_past_max_tokens_on_a_sample_in_flight():
    s, worker = scheduler(True)
    s.add_request(make_request("a", 5, max_tokens=2, ignore_eos=True))
    first = s.schedule()
    second = s.schedule(plan_ahead=True)  # runs on the 1st output token, samples the 2nd
    assert [q.seq_id for q in second.cached_seqs] == ["a"]
    third = s.schedule(plan_ahead=True)  # two samples in flight: none more
    assert third.is_empty
    s.update_from_output(first, worker.execute_model(first, model))
    fourth = s.schedule(plan_ahead=True)  # the 2nd output token is the last: nothing after
    assert fourth.is_empty
    [delta] = s.update_from_output(second, worker.execute_model(second, model))
    assert delta.finish_reason == "length"
    assert s.kv.num_free_blocks == s.num_blocks


def test_a_request_that_ends_on_a_sample_in_flight_drops_the_step_planned_on_it():
    s, worker = scheduler(True)
    s.add_request(make_request("a", 5, max_tokens=10, stop_token_ids=(99,)))
    first = s.schedule()
    second = s.schedule(plan_ahead=True)
    [delta] = s.update_from_output(first, worker.execute(first, lambda _: 99))
    assert delta.finish_reason == "stop"
    assert s.kv.num_free_blocks == s.num_blocks  # freed though the second step runs on it
    assert s.update_from_output(second, worker.execute(second, lambda _: 5)) == []
    assert s.schedule().finished_seq_ids == ["a"]


@pytest.mark.parametrize("kind", ["grammar", "drafts"])
def test_sequences_whose_sample_is_not_kept_hold_planning_ahead_back(kind):
    """A grammar's sample may be deferred, and drafts change what is appended: their worker
    keeps nothing, and planning ahead would leave them a step behind, so it waits."""
    s = make_scheduler(num_blocks=32, async_scheduling=True, num_speculative_tokens=2)
    extra = (
        {"structured_output": StructuredOutput("regex", "[ab]+")}
        if kind == "grammar"
        else {"temperature": 0.0}
    )
    prompt = [5, 6, 7, 5, 6, 7, 5, 6] if kind == "drafts" else 6
    s.add_request(make_request("plain", 6, max_tokens=10, ignore_eos=True))
    s.add_request(make_request("other", prompt, max_tokens=10, ignore_eos=True, **extra))
    worker = FakeWorker(32, 4)
    plan = s.schedule()
    result = worker.execute_model(plan, lambda t: 7 if kind == "grammar" else [5, 6, 7][len(t) % 3])
    s.update_from_output(plan, result)
    plan = s.schedule()
    by_id = {q.seq_id: q for q in plan.cached_seqs}
    assert by_id["plain"].keep_sample
    assert not by_id["other"].keep_sample
    if kind == "drafts":
        assert by_id["other"].draft_token_ids  # drafts: nothing kept
    assert not s.can_plan_ahead()


def test_without_async_scheduling_nothing_is_kept_or_planned_ahead():
    s, _ = scheduler(False)
    s.add_request(make_request("a", 5, max_tokens=10))
    assert not s.schedule().new_seqs[0].keep_sample
    assert not s.can_plan_ahead()


def test_with_speculation_drafted_steps_run_one_after_the_other_and_outputs_stay_the_same():
    """Drafts change what a step appends, so a sequence with drafts keeps nothing and holds
    planning ahead back; the steps without drafts are still planned ahead."""

    def repeats(tokens: list[int]) -> int:  # text that repeats itself: drafts are accepted
        return tokens[-4 if len(tokens) >= 4 else 0]

    reference, _ = drive(*scheduler(False, 64), workload(), ahead=False, next_token=repeats)
    s, worker = scheduler(True, 64, num_speculative_tokens=2)
    outputs, plans_ahead = drive(s, worker, workload(), ahead=True, next_token=repeats)
    assert outputs == reference
    assert s.stats().spec_num_accepted_tokens > 10 and len(plans_ahead) > 5
    assert not any(q.draft_token_ids for p in plans_ahead for q in p.cached_seqs if q.keep_sample)


def test_blocks_are_hashed_over_known_tokens_so_a_follow_up_prompt_hits_them_all():
    """A step planned ahead counts the token being sampled as computed before it is known:
    hashing that block then would cache it under a digest of too few tokens, and a prompt
    that continues the answer would miss it and every block after it."""
    s, worker = scheduler(True, num_blocks=64)
    prompt = [11, 12, 13, 14, 15, 16]
    outputs, plans_ahead = drive(
        s, worker, {0: [make_request("a", prompt, max_tokens=12, ignore_eos=True)]}, ahead=True
    )
    assert planned_on_samples_in_flight(plans_ahead) >= 8
    answer = [t for t in outputs["a"] if isinstance(t, int)]
    follow_up = prompt + answer  # 18 tokens: 4 full blocks computed while "a" ran
    hits_before = s.stats().prefix_cache_hits
    drive(s, worker, {0: [make_request("b", follow_up, max_tokens=1)]}, ahead=True)
    assert s.stats().prefix_cache_hits - hits_before == 16


def test_a_step_planned_on_a_sample_in_flight_takes_no_drafts():
    """Drafts follow the last known token: a step that runs on one still being sampled
    cannot have any (they would be proposed for the wrong position)."""
    s = make_scheduler(num_blocks=32, async_scheduling=True, num_speculative_tokens=2)
    s.add_request(make_request("a", [5, 6, 7, 5, 6, 7, 5, 6], max_tokens=10, temperature=0.0))
    first = s.schedule()  # the prompt: no drafts, and its sample is kept
    assert first.new_seqs[0].keep_sample
    assert not s.can_plan_ahead()  # a pure decode step that could draft comes first
    [seq] = s.schedule(plan_ahead=True).cached_seqs  # planned ahead all the same
    assert seq.draft_token_ids == [] and seq.num_scheduled_tokens == 1 and seq.keep_sample
