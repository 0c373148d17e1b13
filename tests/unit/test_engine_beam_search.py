"""Beam search through the engine (scheduler + model runner) equals transformers'
`generate(num_beams=B, do_sample=False, length_penalty=...)` in fp32: the n best hypotheses,
in order, with their scores; beams share blocks (copy-on-write), survive preemption, and give
every block back."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from pagedserve.services.engine import LLMEngine
from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.shared.protocol import GenerateRequest, SamplingParams
from tests.unit.test_engine import make_engine, random_prompts

PROMPT_LENGTHS = (1, 3, 7, 8, 9, 16, 23, 40)
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENGTHS, seed=11)


@pytest.fixture(scope="module")
def eos(tiny_llama_dir, prompts) -> int:
    """A token the model often picks, as its end token: some beams then stop early, so the
    length penalty and the early-stop rule both matter."""
    engine = make_engine(tiny_llama_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = [r.token_ids for r in engine.generate(prompts, greedy)]
    return Counter(t for out in outputs for t in out[1:]).most_common(1)[0][0]


@torch.inference_mode()
def hf_beams(hf, prompt, width, length_penalty, eos):
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=MAX_TOKENS,
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        length_penalty=length_penalty,
        eos_token_id=eos,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
    )
    beams = []
    for i in range(width):
        tokens = out.sequences[i, len(prompt) :].tolist()
        beams.append((tokens[: tokens.index(eos)] if eos in tokens else tokens, float(
            out.sequences_scores[i])))  # fmt: skip
    return beams


def beam_params(width: int, length_penalty: float, eos: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        beam_width=width,
        n=width,
        length_penalty=length_penalty,
        eos_token_ids=(eos,),
    )


def run_checked(engine: LLMEngine, prompts, params: SamplingParams) -> dict[str, list]:
    """Run every prompt to completion, checking the scheduler's invariants after each step;
    returns each request's beams and the most blocks held at once."""
    scheduler = engine.scheduler
    for i, prompt in enumerate(prompts):
        engine.add_request(GenerateRequest(f"r{i}", prompt, params))
    beams: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            assert delta.error is None, delta.error
            if delta.finished:
                beams[delta.request_id] = delta.beams
        scheduler.check_integrity()
    assert scheduler.kv.num_free_blocks == scheduler.num_blocks  # no block leaked
    return beams


def assert_equal_to_hf(hf, prompts, beams, width, length_penalty, eos) -> int:
    """Returns how many hypotheses stopped at the end token."""
    num_stopped = 0
    for i, prompt in enumerate(prompts):
        ours = beams[f"r{i}"]
        ref = hf_beams(hf, prompt, width, length_penalty, eos)
        assert [b.token_ids for b in ours] == [t for t, _ in ref], f"prompt {i}"
        for b, (_, score) in zip(ours, ref, strict=True):
            assert b.score == pytest.approx(score, rel=1e-5, abs=1e-4), f"prompt {i}"
        num_stopped += sum(b.finish_reason == "stop" for b in ours)
    return num_stopped


@pytest.mark.parametrize(
    "width, length_penalty", [(2, 1.0), (4, 2.0), (4, -1.0), (8, 0.5), (8, 1.0)]
)
def test_beam_search_equals_transformers(tiny_llama_dir, hf, prompts, eos, width, length_penalty):
    engine = make_engine(tiny_llama_dir, max_num_seqs=32)
    beams = run_checked(engine, prompts, beam_params(width, length_penalty, eos))
    num_stopped = assert_equal_to_hf(hf, prompts, beams, width, length_penalty, eos)
    if length_penalty <= 1.0:  # a larger one favours the longest hypotheses
        assert num_stopped > 0
    assert engine.scheduler.stats().num_preemptions == 0


@pytest.mark.parametrize("width", [2, 4, 8])
def test_beam_search_survives_preemption(tiny_llama_dir, hf, prompts, eos, width):
    """So few blocks that beams of concurrent requests preempt each other's groups."""
    engine = make_engine(tiny_llama_dir, num_blocks=width * 7, max_num_seqs=64)
    beams = run_checked(engine, prompts, beam_params(width, 1.0, eos))
    assert engine.scheduler.stats().num_preemptions > 0
    assert_equal_to_hf(hf, prompts, beams, width, 1.0, eos)


def test_beams_share_blocks_and_copy_only_on_write(tiny_llama_dir, prompts, eos):
    engine = make_engine(tiny_llama_dir, max_num_seqs=32)
    scheduler = engine.scheduler
    engine.add_request(GenerateRequest("r", prompts[-1], beam_params(8, 1.0, eos)))
    num_copies = 0
    most_held = 0
    while engine.has_unfinished_requests():
        plan = scheduler.schedule()
        num_copies += len(plan.block_copies)
        most_held = max(most_held, scheduler.num_blocks - scheduler.kv.num_free_blocks)
        result = engine.runner.execute(plan)
        scheduler.update_from_output(plan, result)
    # 40 prompt tokens + 10 outputs at block size 8: 7 blocks per beam without sharing
    assert num_copies > 0
    assert most_held < 8 * 7
    assert scheduler.kv.num_free_blocks == scheduler.num_blocks


def test_n_best_of_a_wider_search_and_an_abort(tiny_llama_dir, hf, prompts, eos):
    engine = make_engine(tiny_llama_dir, max_num_seqs=32)
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, beam_width=4, n=2, eos_token_ids=(eos,)
    )
    beams = run_checked(engine, prompts[:2], params)
    for i, prompt in enumerate(prompts[:2]):
        ref = hf_beams(hf, prompt, 4, 1.0, eos)
        assert [b.token_ids for b in beams[f"r{i}"]] == [t for t, _ in ref[:2]]
    engine.add_request(GenerateRequest("gone", prompts[3], params))
    engine.step()
    engine.step()
    (delta,) = engine.scheduler.abort_requests(["gone"])
    assert (delta.request_id, delta.finish_reason) == ("gone", "abort")
    engine.step()  # the workers drop the beams
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.kv.num_free_blocks == engine.scheduler.num_blocks
    assert not engine.runner.seqs


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"beam_width": 11}, "beam_width"),
        ({"beam_width": 2, "n": 3}, "n must be in"),
        ({"n": 2}, "n must be 1 without beam search"),
        ({"beam_width": 2, "logit_bias": ((5, 1.0),)}, "logit_bias cannot"),
        ({"beam_width": 2, "prompt_logprobs": 1}, "prompt_logprobs cannot"),
        ({"beam_width": 2, "length_penalty": float("inf")}, "length_penalty"),
        ({"beam_width": 40}, "beam_width"),
    ],
)
def test_bad_beam_requests_are_rejected_naming_the_field(tiny_llama_dir, fields, named):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(RequestRejectedError, match=named):
        engine.add_request(GenerateRequest("bad", [5, 6, 7], SamplingParams(**fields)))
    assert not engine.has_unfinished_requests()
