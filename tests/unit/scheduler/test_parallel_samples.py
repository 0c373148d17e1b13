"""The n samples of one prompt share its full blocks: the others wait a step for the first to
compute them, then hit them in the prefix cache."""

from __future__ import annotations

import dataclasses

from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step

PROMPT = list(range(13))  # 3 full blocks + 1 token at block size 4


def sample(request_id: str, group: str | None):
    return dataclasses.replace(make_request(request_id, PROMPT, 3), sample_group=group)


def test_samples_of_one_prompt_share_its_full_blocks():
    s = make_scheduler(num_blocks=16, block_size=4)
    w = FakeWorker(16, 4)
    for i in range(3):
        s.add_request(sample(f"s{i}", "g"))
    plan, _ = run_step(s, w)
    assert [n.seq_id for n in plan.new_seqs] == ["s0"]  # the others wait for its prompt
    plan, _ = run_step(s, w)
    assert {n.seq_id: n.num_computed_tokens for n in plan.new_seqs} == {"s1": 12, "s2": 12}
    tables = [s.kv.get_block_ids(f"s{i}") for i in range(3)]
    assert tables[0][:3] == tables[1][:3] == tables[2][:3]
    assert len({t[3] for t in tables}) == 3  # each computes its own last, partial block
    while s.has_unfinished_requests():
        run_step(s, w)
    assert s.kv.num_free_blocks == 16


def test_requests_outside_a_group_do_not_wait():
    s = make_scheduler(num_blocks=16, block_size=4)
    w = FakeWorker(16, 4)
    s.add_request(sample("a", "g1"))
    s.add_request(sample("b", "g2"))
    s.add_request(sample("c", None))
    plan, _ = run_step(s, w)
    assert [n.seq_id for n in plan.new_seqs] == ["a", "b", "c"]
