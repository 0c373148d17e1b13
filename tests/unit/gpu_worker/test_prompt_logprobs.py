"""Prompt logprobs from the model runner: equal to HF's log-softmax at the same positions,
whether a prompt runs in one step or in chunks beside other sequences, handed over once."""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.prompt_logprobs import PromptLogprobsCollector, prompt_slice
from pagedserve.shared.protocol import CachedSequence, SamplingParams, StepPlan
from tests.fixtures.hf_reference import load_hf
from tests.unit.gpu_worker.test_model_runner import GREEDY, make_runner, new_seq

WITH_PROMPT_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=3)


def hf_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:  # [P - 1, V]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return logits[:-1].log_softmax(-1)


def check_against_hf(result_entry, reference: torch.Tensor, prompt: list[int]) -> None:
    targets = torch.tensor(prompt[1:])
    expected = reference.gather(1, targets.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(result_entry.token_logprobs), expected, atol=1e-4,
                               rtol=1e-4)  # fmt: skip
    expected_ranks = (reference > expected.unsqueeze(1)).sum(-1) + 1
    assert result_entry.ranks == expected_ranks.tolist()
    for position, top in enumerate(result_entry.top_logprobs):
        values, ids = reference[position].topk(3)
        assert [t for t, _ in top] == ids.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in top]), values, atol=1e-4,
                                   rtol=1e-4)  # fmt: skip


def test_one_step_prompt_logprobs_equal_hf(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    prompt = list(range(3, 30))
    plain = list(range(40, 50))
    plan = StepPlan(0, new_seqs=[
        new_seq("plain", plain, range(0, 4)),
        new_seq("a", prompt, range(4, 12), sampling=WITH_PROMPT_LOGPROBS),
    ])  # fmt: skip
    result = runner.execute(plan)
    assert result.seq_ids == ["plain", "a"]
    assert result.prompt_logprobs[0] is None
    check_against_hf(result.prompt_logprobs[1], hf_prompt_logprobs(load_hf(tiny_llama_dir), prompt),
                     prompt)  # fmt: skip


def test_chunked_prompt_collects_across_steps_and_hands_over_once(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    prompt = list(range(5, 25))  # 20 tokens in chunks of 8, 8, 4
    blocks = range(0, 8)
    first = runner.execute(StepPlan(0, new_seqs=[
        new_seq("a", prompt, blocks, num_scheduled=8, sampling=WITH_PROMPT_LOGPROBS),
    ]))  # fmt: skip
    assert first.seq_ids == [] and first.prompt_logprobs is None
    runner.execute(StepPlan(1, cached_seqs=[CachedSequence("a", [], [], 8, 8)]))
    last = runner.execute(StepPlan(2, cached_seqs=[CachedSequence("a", [], [], 16, 4)]))
    assert last.seq_ids == ["a"]
    check_against_hf(last.prompt_logprobs[0], hf_prompt_logprobs(load_hf(tiny_llama_dir), prompt),
                     prompt)  # fmt: skip
    decode = runner.execute(StepPlan(3, cached_seqs=[
        CachedSequence("a", [last.token_ids[0]], [], 20, 1),
    ]))  # fmt: skip
    assert decode.prompt_logprobs is None  # sent once


def test_a_one_token_prompt_has_an_empty_list_and_plain_requests_pay_nothing(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    result = runner.execute(StepPlan(0, new_seqs=[
        new_seq("one", [7], range(0, 2), sampling=WITH_PROMPT_LOGPROBS),
    ]))  # fmt: skip
    assert result.prompt_logprobs[0].token_logprobs == []
    plain = runner.execute(
        StepPlan(1, new_seqs=[new_seq("p", [1, 2, 3], range(2, 4), sampling=GREEDY)])
    )
    assert plain.prompt_logprobs is None


def test_slices_stop_at_the_prompt_and_skip_sent_collectors():
    collector = PromptLogprobsCollector(num_prompt_tokens=6, k=0)
    tokens = [10, 11, 12, 13, 14, 15, 99]  # a resumed sequence: prompt, then one output
    piece = prompt_slice(collector, tokens, num_computed=4, num_scheduled=3, first_row=2)
    assert piece.target_ids == [15] and piece.first_row == 2  # position 4 predicts token 5
    assert prompt_slice(collector, tokens, 5, 2, 0) is None  # past the prompt
    collector.sent = True
    assert prompt_slice(collector, tokens, 0, 7, 0) is None
