"""max_tokens 0 (a prompt-only request: echo / prompt_logprobs, as lm-eval's loglikelihood
sends) and the prompt logprobs a step result carries."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.services.scheduler.request_validator import validate_request
from pagedserve.shared.protocol import PromptLogprobs, StepResult
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step


def test_max_tokens_0_finishes_after_the_prefill_with_no_token_and_frees_its_blocks():
    s = make_scheduler(num_blocks=8, block_size=4, max_num_batched_tokens=4)
    w = FakeWorker(s.num_blocks, s.block_size)
    s.add_request(make_request("a", 10, max_tokens=0))
    _, deltas = run_step(s, w)  # chunked: 4 of 10 prompt tokens, nothing sampled yet
    assert deltas == []
    run_step(s, w)
    _, deltas = run_step(s, w)  # the last chunk reaches the end of the prompt
    (delta,) = deltas
    assert (delta.token_ids, delta.finish_reason, delta.num_output_tokens) == ([], "length", 0)
    assert delta.num_prompt_tokens == 10
    assert not s.has_unfinished_requests() and s.kv.num_free_blocks == 8
    s.check_integrity()


def test_prompt_logprobs_travel_from_the_step_result_to_the_delta():
    s = make_scheduler(num_blocks=8, block_size=4)
    s.add_request(make_request("a", 3, max_tokens=2, prompt_logprobs=1))
    plan = s.schedule()
    logprobs = PromptLogprobs([-1.0, -2.0], [1, 4], [[(5, -0.5)], [(6, -0.2)]])
    result = StepResult(plan.step_id, ["a"], [9], prompt_logprobs=[logprobs])
    (delta,) = s.update_from_output(plan, result)
    assert delta.token_ids == [9] and delta.prompt_logprobs == logprobs
    assert delta.finish_reason is None


def test_prompt_logprobs_requests_skip_the_prefix_cache():
    """Positions served from the cache are never computed, so they would have no logprobs."""
    s = make_scheduler(num_blocks=16, block_size=4)
    w = FakeWorker(s.num_blocks, s.block_size)
    prompt = list(range(100, 113))
    s.add_request(make_request("a", prompt, max_tokens=1))
    run_step(s, w)
    s.add_request(make_request("b", prompt, max_tokens=1, prompt_logprobs=0))
    s.add_request(make_request("c", prompt, max_tokens=1))
    plan, _ = run_step(s, w)
    computed = {n.seq_id: n.num_computed_tokens for n in plan.new_seqs}
    assert computed == {"b": 0, "c": 12}


def test_each_step_records_its_scheduled_tokens_for_iteration_metrics():
    s = make_scheduler(num_blocks=8, block_size=4, max_num_batched_tokens=4)
    w = FakeWorker(s.num_blocks, s.block_size)
    s.add_request(make_request("a", 6, max_tokens=2))
    sizes = [run_step(s, w)[0].num_scheduled_tokens for _ in range(3)]  # 4, 2, then 1 decode
    assert sizes == [4, 2, 1]
    assert (s.iteration_tokens.num, s.iteration_tokens.total) == (3, 7)
    assert s.iteration_tokens.encode().split(",")[:2] == ["1", "3"]  # <= 1: one; <= 8: all


def test_the_engine_refuses_logit_bias_outside_the_vocabulary():
    request = make_request("a", 3, max_tokens=2, logit_bias=((5, 1.0), (900, -2.0)))
    with pytest.raises(RequestRejectedError, match=r"logit_bias \[900\]"):
        validate_request(request, vocab_size=512)
    validate_request(make_request("b", 3, max_tokens=2, logit_bias=((5, 1.0),)), vocab_size=512)
    with pytest.raises(RequestRejectedError, match="finite"):
        validate_request(make_request("c", 3, logit_bias=((5, float("nan")),)), vocab_size=512)
