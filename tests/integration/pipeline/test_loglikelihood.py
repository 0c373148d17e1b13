"""lm-evaluation-harness's `local-completions` loglikelihood through the whole pipeline: its
request (prompt = context + continuation as token ids, echo, max_tokens 0, logprobs 1,
temperature 0) returns HF's log-softmax at the same positions, and `prompt_logprobs` too."""

from __future__ import annotations

import random

import httpx
import pytest
import torch

from tests.fixtures.hf_reference import load_hf
from tests.integration.pipeline.conftest import add_engine, add_gateway, wait_until_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_PAIRS = 20
ATOL = 1e-4  # float32 on both sides; only the summation order differs


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    # chunks of 64 tokens: the longer prompts are prefilled over several steps
    add_engine(pipeline, "engine-ll", 1, "--max-num-batched-tokens", "64")
    add_gateway(pipeline, "gw-ll")
    wait_until_serving(pipeline)
    return pipeline


def make_pairs(vocab_size: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(14)
    pairs = []
    for _ in range(NUM_PAIRS):
        context = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(2, 90))]
        continuation = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(1, 12))]
        pairs.append((context, continuation))
    return pairs


def hf_continuation_logprobs(model, context: list[int], continuation: list[int]) -> list[float]:
    ids = torch.tensor([context + continuation])
    with torch.inference_mode():
        logprobs = model(ids).logits[0].float().log_softmax(-1)  # [S, V]
    positions = range(len(context) - 1, len(context) + len(continuation) - 1)
    return [float(logprobs[p, ids[0, p + 1]]) for p in positions]


def test_loglikelihood_requests_equal_hf(pipeline, served_model_dir):
    model = load_hf(served_model_dir)
    pairs = make_pairs(model.config.vocab_size)
    body = {
        "prompt": [c + x for c, x in pairs], "echo": True, "max_tokens": 0,
        "logprobs": 1, "temperature": 0,
    }  # fmt: skip
    answer = httpx.post(f"{pipeline.base_url()}/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert len(choices) == NUM_PAIRS
    for index, ((context, continuation), choice) in enumerate(zip(pairs, choices, strict=True)):
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(context) + len(continuation)
        assert logprobs["token_logprobs"][0] is None
        ours = logprobs["token_logprobs"][len(context) :]
        expected = hf_continuation_logprobs(model, context, continuation)
        assert ours == pytest.approx(expected, abs=ATOL), f"pair {index}"
        # lm-eval's is_greedy: each token's logprob is the best of its top_logprobs
        tops = logprobs["top_logprobs"][len(context) :]
        greedy = all(lp == max(top.values()) for lp, top in zip(ours, tops, strict=True))
        hf_greedy = _hf_is_greedy(model, context, continuation)
        assert greedy == hf_greedy, f"pair {index}"
    # as vLLM: an echo with max_tokens 0 generates (and counts) one token a choice, not shown
    assert answer.json()["usage"]["completion_tokens"] == NUM_PAIRS


def _hf_is_greedy(model, context: list[int], continuation: list[int]) -> bool:
    ids = torch.tensor([context + continuation])
    with torch.inference_mode():
        logits = model(ids).logits[0]
    best = logits[len(context) - 1 : -1].argmax(-1).tolist()
    return best == continuation


def test_prompt_logprobs_equal_hf_with_ranks(pipeline, served_model_dir):
    model = load_hf(served_model_dir)
    context, continuation = make_pairs(model.config.vocab_size)[3]
    prompt = context + continuation
    body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 3}
    answer = httpx.post(f"{pipeline.base_url()}/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    entries = answer.json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(prompt)
    with torch.inference_mode():
        reference = model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    for position, entry in enumerate(entries[1:]):
        row = reference[position]
        own = entry[str(prompt[position + 1])]
        assert own["logprob"] == pytest.approx(float(row[prompt[position + 1]]), abs=ATOL)
        assert own["rank"] == int((row > row[prompt[position + 1]]).sum()) + 1
        best = row.topk(3).indices.tolist()
        assert {str(t) for t in best} <= set(entry)
