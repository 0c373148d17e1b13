"""n-gram speculative decoding in the scheduler: who gets drafts, and that outputs, KV and
blocks come out as without them. The fake worker's "model" is deterministic and its KV is
simulated slot by slot, so a rejected draft counted as computed, or a block hashed over a
token the request never had, fails a check."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from pagedserve.services.scheduler.ngram_proposer import propose_ngram
from pagedserve.services.scheduler.status_metrics import metric_fields
from pagedserve.shared.protocol import StructuredOutput
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler

CYCLE = [11, 12, 13, 14, 15]


def cycling_model(tokens: list[int]) -> int:
    """Repeats a five-token cycle: after 11 comes 12, ..., after 15 comes 11."""
    last = tokens[-1]
    return CYCLE[(CYCLE.index(last) + 1) % len(CYCLE)] if last in CYCLE else CYCLE[0]


def sometimes_off_model(tokens: list[int]) -> int:
    """The cycle, but every seventh output position breaks it: drafts get rejected too."""
    return 99 if len(tokens) % 7 == 0 else cycling_model(tokens)


def run(scheduler, worker, model, max_steps=500):
    outputs: dict[str, list[int]] = {}
    plans = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            break
        plan = scheduler.schedule()
        scheduler.check_integrity()
        plans.append(plan)
        for delta in scheduler.update_from_output(plan, worker.execute_model(plan, model)):
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
        scheduler.check_integrity()
    assert not scheduler.has_unfinished_requests()
    return outputs, plans


def counting_model(tokens: list[int]) -> int:
    """Counts: 50 51 1 50 51 2 50 51 3 ... (after 51 the number after the last one)."""
    if tokens[-1] == 50:
        return 51
    if tokens[-1] == 51:
        return 1 + max((t for t in tokens if t < 50), default=0)
    return 50


def one_at_a_time(prompt, max_tokens, model):
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(model(tokens))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("model", [cycling_model, sometimes_off_model])
@pytest.mark.parametrize("num_speculative_tokens", [1, 3, 6])
def test_outputs_are_those_of_one_token_per_step(model, num_speculative_tokens):
    scheduler = make_scheduler(
        num_blocks=64, max_model_len=128, num_speculative_tokens=num_speculative_tokens
    )
    worker = FakeWorker(64, 4)
    prompts = {"a": [11, 12, 13, 14, 15, 11, 12], "b": [1, 2, 3, 1, 2], "c": [5, 6]}
    for request_id, prompt in prompts.items():
        scheduler.add_request(make_request(request_id, prompt, max_tokens=30, temperature=0.0))
    outputs, plans = run(scheduler, worker, model)
    for request_id, prompt in prompts.items():
        assert outputs[request_id] == one_at_a_time(prompt, 30, model), request_id
    drafted = [c for p in plans for c in p.cached_seqs if c.draft_token_ids]
    assert drafted, "the cycle recurs: drafts were expected"
    stats = scheduler.stats()
    assert stats.spec_num_drafts == len(drafted)
    assert stats.spec_num_draft_tokens == sum(len(c.draft_token_ids) for c in drafted)
    assert 0 < stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
    if model is sometimes_off_model:
        assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    # per draft position (vLLM's _per_pos): a prefix is accepted, so the counts never rise
    fields = metric_fields(scheduler)
    per_pos = [int(c) for c in str(fields["spec_accepted_per_pos"]).split(",")]
    assert len(per_pos) == fields["num_speculative_tokens"] == num_speculative_tokens
    assert sum(per_pos) == stats.spec_num_accepted_tokens
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] > 0
    assert len(plans) < 30  # 30 tokens each in fewer steps than one token per step takes
    assert scheduler.kv.num_free_blocks == 64  # every block given back


def off_then_cycling(tokens: list[int]) -> int:
    """Breaks the cycle often for its first 50 positions, then keeps to it."""
    if len(tokens) < 50 and (len(tokens) % 4 == 0 or len(tokens) % 9 == 0):
        return 99
    return cycling_model(tokens)


def test_draft_length_follows_the_last_accepted_run():
    """After drafts of which only a run was accepted, a sequence gets at most that run plus
    one; all accepted, one more (up to the setting): a rejected guess costs one row next."""
    scheduler = make_scheduler(
        num_blocks=64, max_model_len=128, num_speculative_tokens=6, speculative_max_num_seqs=16
    )
    worker = FakeWorker(64, 4)
    scheduler.add_request(make_request("r", CYCLE * 2, max_tokens=80, temperature=0.0))
    history = []  # (drafts planned, drafts accepted) per step that had drafts
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        drafts = [d for c in plan.cached_seqs for d in c.draft_token_ids]
        deltas = scheduler.update_from_output(plan, worker.execute_model(plan, off_then_cycling))
        if drafts:
            history.append((len(drafts), sum(len(d.token_ids) for d in deltas) - 1))
    for (_, accepted), (next_drafts, _) in itertools.pairwise(history):
        assert next_drafts <= min(6, accepted + 1)
    assert any(accepted < drafts for drafts, accepted in history)  # the breaks were drafted
    assert any(drafts == 1 for drafts, _ in history)  # ... and shrank the next drafts
    assert max(drafts for drafts, _ in history[len(history) // 2 :]) > 3  # and they grew back


def test_a_stop_token_inside_accepted_drafts_ends_the_request_there():
    scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=4)
    worker = FakeWorker(64, 4)
    scheduler.add_request(
        make_request("r", CYCLE * 2, max_tokens=40, temperature=0.0, stop_token_ids=(14,))
    )
    outputs, _ = run(scheduler, worker, cycling_model)  # 11 12 13 14 come in one step
    assert outputs["r"] == [11, 12, 13]
    assert scheduler.finished_requests[-1].finish_reason == "stop"
    assert scheduler.finished_requests[-1].num_output_tokens == 4  # the stop token counts


def test_max_tokens_bounds_the_drafts():
    scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=6)
    worker = FakeWorker(64, 4)
    scheduler.add_request(make_request("r", CYCLE * 2, max_tokens=3, temperature=0.0))
    outputs, plans = run(scheduler, worker, cycling_model)
    assert outputs["r"] == [11, 12, 13]
    for plan in plans:
        for seq in plan.cached_seqs:
            assert len(seq.draft_token_ids) <= 1  # one output so far: 3 - 1 - 1 drafts at most


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0, "seed": 3},
        {"temperature": 0.0, "logprobs": 0},
        {"temperature": 0.0, "structured_output": StructuredOutput("regex", "[0-9]+")},
    ],
    ids=["sampled", "logprobs", "structured"],
)
def test_no_drafts_for_what_they_cannot_serve_exactly(sampling):
    scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=3)
    worker = FakeWorker(64, 4)
    scheduler.add_request(make_request("r", CYCLE * 2, max_tokens=10, **sampling))
    _, plans = run(scheduler, worker, cycling_model)
    assert not any(c.draft_token_ids for p in plans for c in p.cached_seqs)


def test_no_drafts_in_steps_with_more_sequences_than_allowed():
    scheduler = make_scheduler(
        num_blocks=64, max_model_len=128, num_speculative_tokens=3, speculative_max_num_seqs=2
    )
    worker = FakeWorker(64, 4)
    for i in range(3):
        scheduler.add_request(
            make_request(f"r{i}", CYCLE * 2, max_tokens=8 + 8 * i, temperature=0.0)
        )
    _, plans = run(scheduler, worker, cycling_model)
    for plan in plans:
        running = len(plan.new_seqs) + len(plan.cached_seqs)
        if any(c.draft_token_ids for c in plan.cached_seqs):
            assert running <= 2
    assert any(c.draft_token_ids for p in plans for c in p.cached_seqs)  # once r0 finished


@pytest.mark.parametrize(("num_blocks", "long_max", "short_max"), [(6, 8, 2), (8, 12, 6)])
def test_drafts_never_take_a_block_from_another_sequence(num_blocks, long_max, short_max):
    """A cache just big enough for both requests one token at a time: drafts that would need
    a block no one has freed yet are left out, instead of preempting the other request."""
    scheduler = make_scheduler(
        num_blocks=num_blocks, block_size=4, max_model_len=128, num_speculative_tokens=3
    )
    lengths = {"long": long_max, "short": short_max}
    for request_id, max_tokens in lengths.items():
        scheduler.add_request(
            make_request(request_id, CYCLE * 2, max_tokens=max_tokens, temperature=0.0)
        )
    outputs, plans = run(scheduler, FakeWorker(num_blocks, 4), cycling_model)
    assert scheduler.stats().num_preemptions == 0
    assert any(c.draft_token_ids for p in plans for c in p.cached_seqs)
    for request_id, max_tokens in lengths.items():
        assert outputs[request_id] == one_at_a_time(CYCLE * 2, max_tokens, cycling_model)


def test_no_drafts_in_the_step_after_a_request_finished():
    """Its client may be sending the next request: that step stays short for it."""
    scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=3)
    worker = FakeWorker(64, 4)
    scheduler.add_request(make_request("short", CYCLE * 2, max_tokens=6, temperature=0.0))
    scheduler.add_request(make_request("long", CYCLE * 2, max_tokens=40, temperature=0.0))
    finished_before: list[bool] = []  # per plan: did a request finish since the last plan?
    drafted: list[bool] = []
    finished = False
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        finished_before.append(finished)
        drafted.append(any(c.draft_token_ids for c in plan.cached_seqs))
        deltas = scheduler.update_from_output(plan, worker.execute_model(plan, cycling_model))
        finished = any(d.finished for d in deltas)
    after_finish = finished_before.index(True)
    assert not drafted[after_finish]
    assert drafted[after_finish + 1]  # "long" alone, the step after that: drafts again
    assert any(drafted[:after_finish])


def test_a_scheduler_that_knows_the_vocabulary_drafts_the_count_on():
    """Same outputs; with the vocabulary's size the drafts count on and are accepted, so the
    count takes fewer steps than with the plain lookup."""
    prompt = [50, 51, 1, 50, 51, 2]
    runs = {}
    for vocab_size in (0, 100):
        scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=3,
                                   vocab_size=vocab_size)  # fmt: skip
        scheduler.add_request(make_request("count", prompt, max_tokens=40, temperature=0.0))
        outputs, plans = run(scheduler, FakeWorker(64, 4), counting_model)
        assert outputs["count"] == one_at_a_time(prompt, 40, counting_model)
        runs[vocab_size] = (len(plans), scheduler.stats().spec_num_accepted_tokens)
    assert runs[100][1] > runs[0][1]
    assert runs[100][0] < runs[0][0]


def test_off_in_a_scheduler_given_no_count_and_no_workers_default():
    scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=None)
    scheduler.add_request(make_request("r", CYCLE * 2, max_tokens=10, temperature=0.0))
    _, plans = run(scheduler, FakeWorker(64, 4), cycling_model)
    assert not any(c.draft_token_ids for p in plans for c in p.cached_seqs)


@pytest.mark.parametrize(
    ("tokens", "num", "want"),
    [
        ([1, 2, 3, 4], 3, []),  # nothing recurs
        ([1, 2, 3, 9, 1, 2], 3, [3, 9, 1]),  # "1 2" came before, followed by 3 9 1
        ([1, 2, 3, 9, 1, 2], 1, [3]),
        ([7, 1, 2, 5, 8, 1, 2, 6, 1, 2], 2, [6, 1]),  # the most recent match wins
        ([4, 1, 2, 3, 8, 5, 2, 3, 1, 2, 3], 2, [8, 5]),  # the longest n-gram first: "1 2 3"
        ([5, 5, 5], 2, [5, 5]),  # a match overlapping the suffix: its period, 1, goes on
        ([3, 1, 2, 1, 2], 3, [1, 2, 1]),  # "1 2" ends 2 before the end: "1 2" repeats
        ([3, 1, 2, 1, 2], 1, [1]),
        ([1, 2, 3, 1, 2], 0, []),
    ],
)
def test_propose_ngram(tokens, num, want):
    assert propose_ngram(tokens, num) == want


def ngram_by_scanning(tokens: list[int], num: int, vocab_size: int = 0) -> list[int]:
    """The proposer's rules spelled out as a plain scan: the longest n (4 down to 2) whose
    last-n tokens recur earlier, the most recent such occurrence, what followed it, the text
    written on token by token past its end; then, given a vocabulary, the occurrence before
    that one and the count carried on where the two continuations differ by 0 or 1 id."""
    if num <= 0:
        return []
    for n in range(min(4, len(tokens) - 1), 1, -1):
        suffix = tokens[-n:]
        ends = [e for e in range(len(tokens) - 2, n - 2, -1) if tokens[e - n + 1 : e + 1] == suffix]
        if not ends:
            continue
        text = list(tokens)
        while len(text) < len(tokens) + num:  # copy on one token at a time
            text.append(text[ends[0] + 1 + len(text) - len(tokens)])
        drafts = text[len(tokens) :]
        if vocab_size and len(ends) > 1:
            earlier = tokens[ends[1] + 1 : ends[1] + 1 + num]
            diffs = [b - a for a, b in zip(earlier, drafts, strict=False)]
            counted = [t + d for t, d in zip(drafts, diffs, strict=False)]
            if (
                len(earlier) == num
                and any(diffs)
                and all(d in (-1, 0, 1) for d in diffs)
                and all(0 <= t < vocab_size for t in counted)
            ):
                return counted
        return drafts
    return []


@pytest.mark.parametrize("vocab", [2, 3, 256, 257, 70_000, 2**32 - 1])
def test_propose_ngram_matches_a_plain_scan(vocab):
    """The byte search finds what the scan finds, including where a pattern's bytes also
    occur straddling two tokens (small ids are mostly zero bytes) and ids past 16 bits."""
    rng = random.Random(vocab)
    for _ in range(3000):
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        num = rng.randrange(0, 5)
        assert propose_ngram(tokens, num) == ngram_by_scanning(tokens, num), (tokens, num)


@pytest.mark.parametrize("vocab", [2, 3, 5, 256, 70_000])
def test_counting_on_matches_a_plain_scan(vocab):
    """With a vocabulary, the count rule as the scan spells it, over texts that often count
    (runs of ids that step by one) and ids at both ends of the vocabulary."""
    rng = random.Random(vocab)
    for _ in range(3000):
        start = rng.choice([0, vocab - 1, rng.randrange(vocab)])
        period = [rng.choice([start, min(start + 1, vocab - 1)]) for _ in range(rng.randint(1, 3))]
        tokens = []
        while len(tokens) < rng.randrange(0, 40):
            tokens += [min(max(t + rng.choice([0, 0, 1, -1]), 0), vocab - 1) for t in period]
        num = rng.randrange(0, 5)
        want = ngram_by_scanning(tokens, num, vocab)
        assert propose_ngram(tokens, num, vocab_size=vocab) == want, (tokens, num)


def test_a_count_goes_on_counting():
    """' 2012 2013 2014' as SmolLM2 splits it (a space, then one token a digit, ids 32-41):
    the years go on, where the plain lookup would draft the last year again."""
    space, digit = 216, lambda d: 32 + d
    years = [t for y in (2012, 2013, 2014) for t in [space, *map(digit, map(int, str(y)))]]
    tokens = [99, *years, space, digit(2), digit(0), digit(1)]  # ... 2014 201
    assert propose_ngram(tokens, 3) == [digit(4), space, digit(2)]  # no vocabulary: plain
    assert propose_ngram(tokens, 3, vocab_size=49152) == [digit(5), space, digit(2)]
    tokens += [digit(5), space, digit(2), digit(0)]  # ... 2015 20
    assert propose_ngram(tokens, 3, vocab_size=49152) == [digit(1), digit(6), space]


def test_a_count_never_leaves_the_vocabulary():
    assert propose_ngram([5, 6, 7, 5, 6, 8, 5, 6], 1, vocab_size=10) == [9]
    assert propose_ngram([5, 6, 8, 5, 6, 9, 5, 6], 1, vocab_size=10) == [9]  # 10 is past it
    assert propose_ngram([5, 6, 1, 5, 6, 0, 5, 6], 1, vocab_size=10) == [0]  # -1 is outside
    assert propose_ngram([5, 6, 2, 5, 6, 1, 5, 6], 1, vocab_size=10) == [0]  # counting down


def test_continuations_that_differ_by_more_than_one_id_draft_the_latest():
    assert propose_ngram([8, 1, 5, 8, 3, 5, 8], 2, vocab_size=10) == [3, 5]  # 1 -> 3: no count
    assert propose_ngram([8, 1, 5, 8, 1, 5, 8], 2, vocab_size=10) == [1, 5]  # the same twice


def test_propose_ngram_drafts_nothing_for_ids_outside_32_bits():
    assert propose_ngram([1, 2, 1 << 40, 1, 2], 2) == []
    assert propose_ngram([1, 2, -1, 1, 2], 2) == []


def test_propose_ngram_skips_a_byte_match_that_straddles_two_tokens():
    # little-endian, [256, 0] is 00 01 00 00 00 00 00 00; those bytes recur from byte 17,
    # inside 0x10005, 0, 0x300 (05 00 01 00 | 00 00 00 00 | 00 03 00 00): no token match
    tokens = [256, 0, 7, 9, 0x10005, 0, 0x300, 256, 0]
    assert propose_ngram(tokens, 2) == ngram_by_scanning(tokens, 2) == [7, 9]


def test_preemption_with_drafts_in_the_plan_loses_nothing():
    """Few blocks: requests with drafts get preempted and recomputed, outputs unchanged."""
    scheduler = make_scheduler(
        num_blocks=14, max_model_len=64, num_speculative_tokens=3, speculative_max_num_seqs=8
    )
    worker = FakeWorker(14, 4)
    prompts = {f"r{i}": CYCLE * 2 + [11 + i] for i in range(3)}
    for request_id, prompt in prompts.items():
        scheduler.add_request(make_request(request_id, prompt, max_tokens=20, temperature=0.0))
    outputs, plans = run(scheduler, worker, sometimes_off_model)
    for request_id, prompt in prompts.items():
        assert outputs[request_id] == one_at_a_time(prompt, 20, sometimes_off_model)
    assert any(p.preempted_seq_ids for p in plans), "the cache is small enough to preempt"
    assert any(c.draft_token_ids for p in plans for c in p.cached_seqs)
    assert scheduler.kv.num_free_blocks == 14


def test_tokens_a_worker_returns_beyond_the_drafts_are_ignored():
    """A worker answering with more tokens than the plan drafted (a bug, or a stale plan)
    cannot make a request skip ahead of what its KV holds."""
    scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=2)
    worker = FakeWorker(64, 4)
    scheduler.add_request(make_request("r", [1, 2, 3], max_tokens=10, temperature=0.0))
    prefill = scheduler.schedule()  # a new sequence: never drafts
    result = worker.execute_model(prefill, cycling_model)
    bad = dataclasses.replace(result, more_token_ids=[[12, 13, 14]])
    [delta] = scheduler.update_from_output(prefill, bad)
    assert delta.token_ids == [11]
    request = scheduler.get_request("r")
    assert request.num_computed_tokens == 3 and request.num_tokens == 4
    scheduler.check_integrity()


def test_no_drafts_while_a_prompt_waits_or_is_part_way_through_its_prefill():
    """Drafts would take the step's token budget from arriving prompts: only pure decode
    steps get them, and the outputs stay those of one token per step."""
    scheduler = make_scheduler(
        num_blocks=64, max_model_len=128, num_speculative_tokens=3, max_num_batched_tokens=8
    )
    worker = FakeWorker(64, 4)
    scheduler.add_request(make_request("early", CYCLE * 2, max_tokens=40, temperature=0.0))
    prompts = {"early": CYCLE * 2, "late": list(range(20, 50))}  # 30 tokens: 4+ chunks of 8
    outputs: dict[str, list[int]] = {}
    drafted_beside_a_prefill = drafted_after = 0
    for step in range(300):
        if step == 6:
            scheduler.add_request(make_request("late", prompts["late"], 20, temperature=0.0))
        if not scheduler.has_unfinished_requests():
            break
        plan = scheduler.schedule()
        prefilling = any(len(c.draft_token_ids) == 0 and c.num_scheduled_tokens > 1
                         for c in plan.cached_seqs) or bool(plan.new_seqs)  # fmt: skip
        drafts = sum(len(c.draft_token_ids) for c in plan.cached_seqs)
        drafted_beside_a_prefill += drafts if prefilling else 0
        drafted_after += drafts if step > 6 and not prefilling else 0
        for delta in scheduler.update_from_output(plan, worker.execute_model(plan, cycling_model)):
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    assert drafted_beside_a_prefill == 0
    assert drafted_after > 0  # once "late" is in decode, both draft again
    assert outputs["early"] == one_at_a_time(prompts["early"], 40, cycling_model)
    assert outputs["late"] == one_at_a_time(prompts["late"], 20, cycling_model)


def test_sequences_short_of_min_tokens_get_drafts_and_the_same_outputs():
    """The fake worker samples each draft's row with that draft's history, as the real one
    does, so min_tokens holds the stop token back at the same positions with or without
    drafts."""
    prompt = CYCLE * 2
    outputs = {}
    for k in (0, 3):
        scheduler = make_scheduler(num_blocks=64, max_model_len=128, num_speculative_tokens=k)
        request = make_request("r", prompt, max_tokens=20, temperature=0.0, min_tokens=12,
                               stop_token_ids=(14,))  # fmt: skip
        scheduler.add_request(request)
        outputs[k], plans = run(scheduler, FakeWorker(64, 4), cycling_model)
        assert bool([c for p in plans for c in p.cached_seqs if c.draft_token_ids]) == (k > 0)
        assert scheduler.finished_requests[-1].finish_reason == "stop"
    # 14 comes every fifth token; the first that may stop the request is the 14th output
    assert outputs[3]["r"] == outputs[0]["r"] == one_at_a_time(prompt, 13, cycling_model)
