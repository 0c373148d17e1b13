from __future__ import annotations

from dataclasses import replace

import pytest

from pagedserve.services.scheduler.errors import QueueFullError, RequestRejectedError
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, StepResult
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step


def worker_for(s: Scheduler) -> FakeWorker:
    return FakeWorker(s.num_blocks, s.block_size)


def refcounts(s: Scheduler, block_ids: list[int]) -> list[int]:
    return [s.kv.pool.blocks[i].ref_count for i in block_ids]


def test_exact_block_ids_and_deltas() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    w = worker_for(s)
    s.add_request(make_request("a", 6, max_tokens=8))
    s.add_request(make_request("b", 5, max_tokens=8))
    plan, deltas = run_step(s, w)
    assert [(n.seq_id, n.block_ids, n.num_scheduled_tokens) for n in plan.new_seqs] == [
        ("a", [0, 1], 6),
        ("b", [2, 3], 5),
    ]
    assert [(d.request_id, d.token_ids, d.num_output_tokens) for d in deltas] == [
        ("a", [7], 1),
        ("b", [7], 1),
    ]
    plan, _ = run_step(s, w)  # a: 7 tokens, b: 6 tokens, both still in 2 blocks
    assert [(c.seq_id, c.new_token_ids, c.new_block_ids) for c in plan.cached_seqs] == [
        ("a", [7], []),
        ("b", [7], []),
    ]
    run_step(s, w)  # a computes its 8th token
    plan, _ = run_step(s, w)  # a's 9th token needs a third block: the head of the free queue
    assert plan.cached_seqs[0].new_block_ids == [4]
    assert plan.cached_seqs[0].num_computed_tokens == 8
    assert s.kv.get_block_ids("a") == [0, 1, 4]


def test_prefix_hit_shares_blocks_with_a_running_request() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    w = worker_for(s)
    prompt = list(range(13))  # 3 full blocks + 1 token
    s.add_request(make_request("a", prompt, max_tokens=8))
    run_step(s, w)
    s.add_request(make_request("b", [*prompt[:12], 50, 51], max_tokens=8))
    plan, deltas = run_step(s, w)
    (new,) = plan.new_seqs
    assert new.block_ids == [0, 1, 2, 4]
    assert (new.num_computed_tokens, new.num_scheduled_tokens) == (12, 2)
    assert refcounts(s, [0, 1, 2, 3, 4]) == [2, 2, 2, 1, 1]
    assert {d.request_id: d.num_cached_tokens for d in deltas} == {"a": 0, "b": 12}
    st = s.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (13 + 14, 12)


def test_prefix_hit_on_a_finished_request_reuses_its_free_blocks() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    w = worker_for(s)
    prompt = list(range(13))
    s.add_request(make_request("a", prompt, max_tokens=1))
    _, deltas = run_step(s, w)
    assert deltas[0].finish_reason == "length"
    assert s.kv.num_free_blocks == 8
    s.add_request(make_request("b", prompt, max_tokens=1))
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].block_ids[:3] == [0, 1, 2]
    assert plan.new_seqs[0].num_computed_tokens == 12


def test_reset_prefix_cache_makes_the_same_prompt_miss() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    w = worker_for(s)
    prompt = list(range(13))  # 3 full blocks + 1 token
    s.add_request(make_request("a", prompt, max_tokens=1))
    run_step(s, w)
    s.reset_prefix_cache()
    s.check_integrity()
    assert s.kv.pool.cached_blocks == {}
    s.add_request(make_request("b", prompt, max_tokens=1))
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].num_computed_tokens == 0
    st = s.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (13 + 13, 0)
    s.add_request(make_request("c", prompt, max_tokens=1))  # b's blocks are cached again
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].num_computed_tokens == 12


def test_reset_prefix_cache_is_refused_while_a_request_runs() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    w = worker_for(s)
    s.add_request(make_request("a", list(range(13)), max_tokens=4))
    run_step(s, w)
    s.add_request(make_request("b", 5))
    with pytest.raises(ValueError, match=r"unfinished \(1 running, 1 waiting\)"):
        s.reset_prefix_cache()
    assert len(s.kv.pool.cached_blocks) == 3  # nothing was forgotten
    s.abort_requests(["a", "b"])
    s.reset_prefix_cache()
    assert s.kv.pool.cached_blocks == {}


def test_never_the_whole_prompt_from_cache() -> None:
    s = make_scheduler(num_blocks=8, block_size=4)
    w = worker_for(s)
    s.add_request(make_request("a", list(range(8)), max_tokens=1))
    run_step(s, w)
    s.add_request(make_request("b", list(range(8)), max_tokens=1))
    plan, deltas = run_step(s, w)
    assert (plan.new_seqs[0].num_computed_tokens, plan.new_seqs[0].num_scheduled_tokens) == (4, 4)
    assert deltas[0].token_ids == [7]


def test_eviction_takes_the_least_recent_and_tail_blocks_first() -> None:
    s = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    w = worker_for(s)
    s.add_request(make_request("a", list(range(8)), max_tokens=1))
    run_step(s, w)  # a finishes; blocks 1 then 0 go to the tail: free queue [2, 3, 1, 0]
    assert [b.block_id for b in s.kv.pool.free_queue] == [2, 3, 1, 0]
    s.add_request(make_request("c", list(range(50, 61)), max_tokens=1))
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].block_ids == [2, 3, 1]  # a's tail block evicted, its head kept
    s.add_request(make_request("d", [*range(8), 99], max_tokens=1))
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].num_computed_tokens == 4
    assert plan.new_seqs[0].block_ids[0] == 0


def test_prefix_caching_disabled() -> None:
    s = make_scheduler(enable_prefix_caching=False)
    w = worker_for(s)
    s.add_request(make_request("a", list(range(13)), max_tokens=1))
    run_step(s, w)
    s.add_request(make_request("b", list(range(13)), max_tokens=1))
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].num_computed_tokens == 0
    assert s.stats().prefix_cache_hits == 0


def test_chunked_prefill_respects_the_token_budget() -> None:
    s = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=8)
    w = worker_for(s)
    s.add_request(make_request("d", 3, max_tokens=10))
    run_step(s, w)  # d is decoding now
    s.add_request(make_request("long", 20, max_tokens=2))
    chunks, sampled = [], []
    for _ in range(3):
        plan, deltas = run_step(s, w)
        assert plan.num_scheduled_tokens <= 8
        chunks += [n.num_scheduled_tokens for n in plan.new_seqs]
        chunks += [c.num_scheduled_tokens for c in plan.cached_seqs if c.seq_id == "long"]
        sampled.append([d.request_id for d in deltas])
    assert chunks == [7, 7, 6]  # 8 minus d's decode token each step
    assert sampled == [["d"], ["d"], ["d", "long"]]  # sampled only when the prompt is done


def test_without_chunking_a_prompt_waits_for_a_whole_budget() -> None:
    s = make_scheduler(
        num_blocks=16, max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False
    )
    w = worker_for(s)
    s.add_request(make_request("d", 3, max_tokens=10))
    s.add_request(make_request("long", 14, max_tokens=2))
    plan, _ = run_step(s, w)
    assert [n.seq_id for n in plan.new_seqs] == ["d"]  # 3 + 14 > 16
    plan, _ = run_step(s, w)
    assert [(n.seq_id, n.num_scheduled_tokens) for n in plan.new_seqs] == [("long", 14)]
    assert plan.cached_seqs[0].seq_id == "d"  # 1 + 14 <= 16: the whole prompt in one step


def test_max_num_seqs_bounds_the_batch() -> None:
    s = make_scheduler(num_blocks=16, max_num_seqs=2)
    w = worker_for(s)
    for i in range(3):
        s.add_request(make_request(f"r{i}", 2, max_tokens=3))
    plan, _ = run_step(s, w)
    assert [n.seq_id for n in plan.new_seqs] == ["r0", "r1"]
    assert s.stats().num_waiting == 1


def test_preemption_and_resume_with_outputs_so_far() -> None:
    s = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    w = worker_for(s)
    s.add_request(make_request("a", 8, max_tokens=4))
    s.add_request(make_request("b", list(range(200, 208)), max_tokens=4))
    run_step(s, w, lambda _: 11)  # both hold 2 blocks and have 9 tokens
    plan, _ = run_step(s, w, lambda _: 12)  # a needs a 3rd block: the newest (b) is preempted
    assert plan.preempted_seq_ids == ["b"]
    assert [c.seq_id for c in plan.cached_seqs] == ["a"] and plan.new_seqs == []
    assert plan.cached_seqs[0].new_block_ids == [3]  # b's tail block, freed first
    assert s.stats().num_preemptions == 1 and s.stats().num_waiting == 1
    resumed = None
    for _ in range(4):
        plan, _ = run_step(s, w, lambda _: 13)
        resumed = resumed or next((n for n in plan.new_seqs if n.seq_id == "b"), None)
    assert resumed is not None
    assert resumed.token_ids == [*range(200, 208), 11]  # prompt + the output sampled so far
    assert resumed.num_prompt_tokens == 8
    assert resumed.num_computed_tokens == 4  # its first block was still cached


def test_a_sequence_preempts_itself_when_it_is_the_newest() -> None:
    s = make_scheduler(num_blocks=3, block_size=4, max_model_len=12)
    w = worker_for(s)
    s.add_request(make_request("a", 4, max_tokens=8))
    s.add_request(make_request("b", 4, max_tokens=8))
    run_step(s, w)  # a: [0], b: [1]; 5 tokens each
    run_step(s, w)  # a takes block 2; b's 5th token needs a block: b is the newest -> itself
    assert s.stats().num_running == 1 and [r.request_id for r in s.waiting] == ["b"]
    assert s.get_request("b").num_preemptions == 1


def test_abort_frees_blocks_and_reports_finished_ids() -> None:
    s = make_scheduler(num_blocks=8)
    w = worker_for(s)
    s.add_request(make_request("a", 6, max_tokens=8))
    s.add_request(
        make_request(
            "b",
            6,
            max_tokens=8,
        )
    )
    run_step(s, w)
    s.add_request(make_request("waiting", 2))
    assert s.kv.num_free_blocks == 4
    deltas = s.abort_requests(["a", "nope", "waiting"], reason="client disconnected")
    assert [(d.request_id, d.finish_reason, d.num_output_tokens) for d in deltas] == [
        ("a", "abort", 1),
        ("waiting", "abort", 0),
    ]
    assert s.kv.num_free_blocks == 6
    s.check_integrity()
    plan = s.schedule()
    assert set(plan.finished_seq_ids) == {"a", "waiting"}
    assert [c.seq_id for c in plan.cached_seqs] == ["b"]
    # a result for the aborted sequence arriving late is ignored
    deltas = s.update_from_output(plan, StepResult(plan.step_id, ["a", "b"], [1, 2]))
    assert [d.request_id for d in deltas] == ["b"]
    assert s.stats().num_aborted == 2


def drive_tokens(tokens: list[int], **sampling: object) -> list:
    """Run one request through steps that sample `tokens` in turn; return its deltas."""
    s = make_scheduler(num_blocks=16, max_model_len=sampling.pop("max_model_len", 64))
    w = worker_for(s)
    s.add_request(make_request("r", 3, **sampling))
    out = []
    for token in tokens:
        _, deltas = run_step(s, w, lambda _, t=token: t)
        out += deltas
        if deltas and deltas[-1].finished:
            break
    assert not s.has_unfinished_requests()
    return out


def test_eos_stops_and_is_hidden_but_counted() -> None:
    deltas = drive_tokens([5, 2, 6], max_tokens=10, eos_token_ids=(2,))
    assert [d.token_ids for d in deltas] == [[5], []]
    last = deltas[-1]
    assert (last.finish_reason, last.stop_token_id, last.num_output_tokens) == ("stop", 2, 2)
    assert last.num_prompt_tokens == 3


def test_min_tokens_holds_off_eos_and_stop_ids() -> None:
    deltas = drive_tokens(
        [2, 9, 2], max_tokens=10, eos_token_ids=(2,), stop_token_ids=(9,), min_tokens=3
    )
    assert [d.token_ids for d in deltas] == [[2], [9], []]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].num_output_tokens == 3


def test_ignore_eos_runs_to_max_tokens() -> None:
    deltas = drive_tokens([2, 2, 2], max_tokens=3, eos_token_ids=(2,), ignore_eos=True)
    assert [d.token_ids for d in deltas] == [[2], [2], [2]]
    assert deltas[-1].finish_reason == "length" and deltas[-1].stop_token_id is None


def test_stop_token_id_even_with_ignore_eos() -> None:
    deltas = drive_tokens([4, 9], max_tokens=5, stop_token_ids=(9,), ignore_eos=True)
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_token_id == 9


def test_max_model_len_ends_with_length() -> None:
    deltas = drive_tokens([4, 4, 4, 4], max_tokens=2, max_model_len=5)
    assert [d.token_ids for d in deltas] == [[4], [4]] and deltas[-1].finish_reason == "length"


def test_logprobs_are_copied_when_asked() -> None:
    s = make_scheduler()
    s.add_request(make_request("lp", 2, max_tokens=2, logprobs=1))
    s.add_request(make_request("no", 2, max_tokens=2))
    plan = s.schedule()
    top = [[(7, -0.1), (8, -2.0)], [(7, -0.2), (3, -1.0)]]
    result = StepResult(plan.step_id, ["lp", "no"], [7, 7], [-0.1, -0.2], top)
    deltas = s.update_from_output(plan, result)
    assert (deltas[0].logprobs, deltas[0].top_logprobs) == ([-0.1], [top[0]])
    assert (deltas[1].logprobs, deltas[1].top_logprobs) == (None, None)


def test_step_error_fails_every_sequence_of_the_step() -> None:
    s = make_scheduler()
    s.add_request(make_request("a", 2))
    s.add_request(make_request("b", 2))
    plan = s.schedule()
    deltas = s.update_from_output(plan, StepResult(plan.step_id, [], [], error="CUDA OOM"))
    assert [(d.finish_reason, d.error, d.error_code) for d in deltas] == [
        ("error", "CUDA OOM", "engine_error")
    ] * 2
    assert s.kv.num_free_blocks == s.num_blocks and not s.has_unfinished_requests()
    s.check_integrity()


def test_a_missing_sample_fails_the_sequence_instead_of_hanging() -> None:
    s = make_scheduler()
    s.add_request(make_request("a", 2))
    plan = s.schedule()
    (delta,) = s.update_from_output(plan, StepResult(plan.step_id, [], []))
    assert delta.finish_reason == "error" and "no token for a" in delta.error
    with pytest.raises(ValueError, match="result of step 5 given for plan 1"):
        s.update_from_output(s.schedule(), StepResult(5, [], []))


def test_preempt_all_resends_everything_in_order() -> None:
    s = make_scheduler(num_blocks=8)
    w = worker_for(s)
    s.add_request(make_request("a", 5))
    s.add_request(make_request("b", 5))
    run_step(s, w)
    s.add_request(make_request("c", 2))
    assert s.preempt_all() == 2
    assert [r.request_id for r in s.waiting] == ["a", "b", "c"]
    assert s.kv.num_free_blocks == 8
    s.check_integrity()
    w = worker_for(s)  # a restarted worker: no state
    plan, _ = run_step(s, w)
    assert [(n.seq_id, len(n.token_ids)) for n in plan.new_seqs] == [("a", 6), ("b", 6), ("c", 2)]
    assert plan.preempted_seq_ids == []  # re-sent in full in the same plan


def test_priority_policy_admits_lower_priority_value_first() -> None:
    s = make_scheduler(policy="priority", max_num_seqs=1)
    s.add_request(make_request("late", 2, priority=5))
    s.add_request(make_request("urgent", 2, priority=0))
    assert [n.seq_id for n in s.schedule().new_seqs] == ["urgent"]


def test_priority_preemption_evicts_the_lowest_priority_even_if_already_planned() -> None:
    """vLLM's rule: the victim is the running request with the largest (priority, arrival),
    here the low-priority one that arrived first and was already planned this step."""
    s = make_scheduler(num_blocks=5, block_size=4, policy="priority")
    w = FakeWorker(5, 4)
    s.add_request(make_request("low", 7, max_tokens=8, priority=5))
    run_step(s, w)  # low: 2 blocks, 8 tokens known
    s.add_request(make_request("high", [200 + i for i in range(7)], max_tokens=8, priority=0))
    run_step(s, w)  # high: 2 blocks (no prefix shared); 1 block left
    plan, _ = run_step(s, w)  # low's 9th token takes the last block
    assert plan.preempted_seq_ids == [] and s.kv.num_free_blocks == 0
    plan, deltas = run_step(s, w)  # high needs a 3rd block: low goes, high keeps running
    assert plan.preempted_seq_ids == ["low"]
    assert [c.seq_id for c in plan.cached_seqs] == ["high"]
    assert [d.request_id for d in deltas] == ["high"]
    assert s.get_request("low").num_preemptions == 1
    assert s.get_request("high").num_preemptions == 0
    assert [r.request_id for r in s.running] == ["high"]


def test_fcfs_preemption_still_evicts_the_newest() -> None:
    s = make_scheduler(num_blocks=5, block_size=4)
    w = FakeWorker(5, 4)
    s.add_request(make_request("old", 7, max_tokens=8, priority=5))
    run_step(s, w)
    s.add_request(make_request("new", [200 + i for i in range(7)], max_tokens=8, priority=0))
    run_step(s, w)
    run_step(s, w)
    plan, _ = run_step(s, w)
    assert plan.preempted_seq_ids == ["new"]
    assert [r.request_id for r in s.running] == ["old"]


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        (
            dict(prompt_token_ids=60, max_tokens=10),
            r"prompt \(60 tokens\) \+ max_tokens \(10\) "
            r"exceeds max_model_len \(64\)",
        ),
        (
            dict(prompt_token_ids=30, max_tokens=10),
            r"needs 10 KV blocks of 4 tokens but the "
            r"whole cache has 8",
        ),
        (dict(prompt_token_ids=[], max_tokens=1), "the prompt is empty"),
        (dict(prompt_token_ids=2, max_tokens=-1), "max_tokens must be >= 0, got -1"),
        (dict(prompt_token_ids=2, top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    ],
)
def test_rejections_state_the_numbers(request_kwargs: dict, message: str) -> None:
    s = make_scheduler(num_blocks=8, block_size=4, max_model_len=64)
    with pytest.raises(RequestRejectedError, match=message):
        s.add_request(make_request("x", **request_kwargs))
    assert not s.has_unfinished_requests()


def test_duplicate_id_and_queue_full() -> None:
    s = make_scheduler(max_waiting=1)
    s.add_request(make_request("a", 2))
    with pytest.raises(RequestRejectedError, match="'a' is already in use"):
        s.add_request(make_request("a", 2))
    with pytest.raises(QueueFullError, match="max_waiting=1"):
        s.add_request(make_request("b", 2))
    assert issubclass(RequestRejectedError, ValueError)


def test_num_blocks_must_be_known() -> None:
    with pytest.raises(ValueError, match="num_blocks must be set"):
        Scheduler(SchedulerConfig(), CacheConfig())


def test_block_size_must_be_known() -> None:
    with pytest.raises(ValueError, match="block_size must be set"):
        Scheduler(SchedulerConfig(), CacheConfig(num_blocks=8))


def test_max_num_batched_tokens_must_be_known() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be set"):
        Scheduler(SchedulerConfig(), CacheConfig(block_size=16, num_blocks=8))


def test_stats_and_timeline() -> None:
    s = make_scheduler(num_blocks=8)
    w = worker_for(s)
    s.add_request(make_request("a", 6, max_tokens=2))
    run_step(s, w)
    st = s.stats()
    assert (st.num_running, st.num_free_blocks, st.num_total_blocks) == (1, 6, 8)
    assert st.kv_usage == pytest.approx(0.25)
    request = s.get_request("a")
    assert request.arrival_time <= request.first_scheduled_time <= request.first_token_time
    run_step(s, w)
    assert s.stats().num_finished == 1 and s.finished_requests[-1].finish_reason == "length"


def test_a_finished_request_leaves_its_outcome_and_timeline_not_its_tokens() -> None:
    """The scheduler had kept its last 4096 finished `Request`s whole, prompts and block
    hashes with them: 1.5 GiB of 8000-token prompts."""
    import gc

    from pagedserve.services.scheduler.request import Request

    s = make_scheduler(num_blocks=8)
    w = worker_for(s)
    s.add_request(make_request("a", 6, max_tokens=2))
    run_step(s, w)
    run_step(s, w)
    record = s.finished_requests[-1]
    assert (record.request_id, record.finish_reason) == ("a", "length")
    assert (record.num_prompt_tokens, record.num_output_tokens) == (6, 2)
    assert record.arrival_time <= record.first_scheduled_time <= record.first_token_time
    assert record.first_token_time <= record.finish_time
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) is Request and o.request_id == "a"]
    assert not alive, "the finished request is still held"


def test_sampling_params_default_is_valid() -> None:
    SamplingParams().validate()


def bad_request(**fields: object) -> GenerateRequest:
    """A request as a buggy or hostile writer might put it in Redis: no dataclass checks."""
    request = make_request("bad", 3)
    sampling = fields.pop("sampling", {})
    if sampling:
        request = replace(request, sampling=replace(request.sampling, **sampling))
    return replace(request, **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(prompt_token_ids=[1, 50_000]),
            r"prompt token ids \[50000\] are outside the "
            r"vocabulary \[0, 1000\)",
        ),
        (dict(prompt_token_ids=[1, -3]), r"\[-3\] are outside the vocabulary"),
        (dict(prompt_token_ids=[1, "2"]), "prompt_token_ids must be a list of integers"),
        (dict(prompt_token_ids="abc"), "prompt_token_ids must be a list of integers"),
        (dict(priority="high"), "priority must be an integer"),
        (dict(sampling=dict(temperature=float("nan"))), "temperature must be a finite number"),
        (dict(sampling=dict(top_p="0.5")), "top_p must be a finite number"),
        (dict(sampling=dict(max_tokens=2.5)), "max_tokens must be a 64-bit integer"),
        (dict(sampling=dict(seed=1 << 70)), "seed must be a 64-bit integer"),
        (dict(sampling=dict(stop_token_ids=(5, 4000))), r"stop_token_ids \[4000\] are outside"),
        (dict(sampling=dict(ignore_eos=1)), "ignore_eos must be a boolean"),
        (dict(sampling=dict(repetition_penalty=float("inf"))), "must be a finite number"),
    ],
)
def test_the_engine_validates_every_field_whoever_wrote_the_request(
    fields: dict, message: str
) -> None:
    s = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_model_len=64),
        CacheConfig(block_size=4, num_blocks=8),
        vocab_size=1000,
    )
    s.add_request(make_request("fine", 3))
    with pytest.raises(RequestRejectedError, match=message):
        s.add_request(bad_request(**fields))
    assert [r.request_id for r in s.waiting] == ["fine"]  # the co-queued request is untouched
    w = FakeWorker(8, 4)
    _, deltas = run_step(s, w)
    assert [d.request_id for d in deltas] == ["fine"]


def test_a_negative_seed_is_a_valid_int64() -> None:
    s = make_scheduler()
    s.add_request(make_request("seeded", 3, seed=-(1 << 63)))
    assert s.has_unfinished_requests()
