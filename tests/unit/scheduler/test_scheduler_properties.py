"""Random workloads on a small cache: no leaked block, no broken budget, every invariant after
every step, the fake worker's KV contents always right, and every request that fits finishes."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagedserve.services.scheduler.errors import RequestRejectedError
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler

EOS = 0

request_strategy = st.fixed_dictionaries(
    {
        "arrival_step": st.integers(0, 6),
        # A tiny vocabulary so that prompts share prefixes and hit the cache.
        "prompt": st.lists(st.integers(1, 3), min_size=1, max_size=16),
        "max_tokens": st.integers(1, 8),
        "min_tokens": st.integers(0, 2),
        "abort_step": st.one_of(st.none(), st.integers(0, 20)),
        "priority": st.integers(0, 2),
    }
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(request_strategy, min_size=3, max_size=12),
    num_blocks=st.integers(4, 12),
    block_size=st.sampled_from([2, 4]),
    max_num_seqs=st.integers(1, 4),
    max_num_batched_tokens=st.integers(1, 16),
    policy=st.sampled_from(["fcfs", "priority"]),
    restart_step=st.one_of(st.none(), st.integers(1, 15)),
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=17),
)
def test_random_workloads_keep_every_invariant(
    requests: list[dict],
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    policy: str,
    restart_step: int | None,
    tokens: list[int],
) -> None:
    s = make_scheduler(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=24,
        policy=policy,
    )
    worker = FakeWorker(num_blocks, block_size)
    accepted: dict[str, dict] = {}
    finished: dict[str, str] = {}
    counter = iter(range(10**9))
    next_token = lambda _: tokens[next(counter) % len(tokens)]

    for step in range(400):
        for i, spec in enumerate(requests):
            if spec["arrival_step"] == step:
                _try_add(s, f"r{i}", spec, accepted)
        aborts = [f"r{i}" for i, spec in enumerate(requests) if spec["abort_step"] == step]
        for delta in s.abort_requests(aborts):
            finished[delta.request_id] = delta.finish_reason
        if step == restart_step:
            s.preempt_all()
            worker = FakeWorker(num_blocks, block_size)
        s.check_integrity()
        plan = s.schedule()
        s.check_integrity()
        seqs = [*plan.new_seqs, *plan.cached_seqs]
        assert plan.num_scheduled_tokens <= max_num_batched_tokens
        assert len(seqs) <= max_num_seqs
        assert len({q.seq_id for q in seqs}) == len(seqs)
        for delta in s.update_from_output(plan, worker.execute(plan, next_token)):
            assert delta.request_id not in finished, "a delta after the finish"
            if delta.finished:
                finished[delta.request_id] = delta.finish_reason
                _check_final(delta, accepted[delta.request_id])
        s.check_integrity()
        if step > 20 and not s.has_unfinished_requests():
            break

    assert not s.has_unfinished_requests(), f"stuck: {s.stats()}"
    stats = s.stats()
    event(f"preempted: {stats.num_preemptions > 0}")
    event(f"prefix hits: {stats.prefix_cache_hits > 0}")
    event(f"finish reasons: {sorted(set(finished.values()))}")
    assert set(finished) == set(accepted)
    assert s.kv.num_free_blocks == num_blocks  # nothing leaked
    assert all(b.ref_count == 0 for b in s.kv.pool.blocks)


def _try_add(s, request_id: str, spec: dict, accepted: dict[str, dict]) -> None:
    request = make_request(
        request_id,
        spec["prompt"],
        max_tokens=spec["max_tokens"],
        min_tokens=min(spec["min_tokens"], spec["max_tokens"]),
        priority=spec["priority"],
        eos_token_ids=(EOS,),
    )
    num_tokens = len(spec["prompt"]) + spec["max_tokens"]
    fits = num_tokens <= 24 and -(-num_tokens // s.block_size) <= s.num_blocks
    try:
        s.add_request(request)
    except RequestRejectedError:
        assert not fits
        return
    assert fits
    accepted[request_id] = spec


def _check_final(delta, spec: dict) -> None:
    assert delta.finish_reason in ("stop", "length", "abort")
    assert delta.num_output_tokens <= spec["max_tokens"]
    if delta.finish_reason == "length":
        assert delta.num_output_tokens == spec["max_tokens"]
    if delta.finish_reason == "stop":
        assert delta.stop_token_id == EOS
        assert delta.num_output_tokens >= min(spec["min_tokens"], spec["max_tokens"])
