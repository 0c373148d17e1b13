from __future__ import annotations

import pytest

from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.openai_schema import parse_chat_request, parse_completion_request
from pagedserve.services.gateway.request_builder import (
    check_lengths,
    engine_requests,
    tokenize_chat,
    tokenize_completion,
)


def build(info, **fields):
    request = parse_completion_request({"prompt": "hi there", **fields})
    prompts = tokenize_completion(request, info)
    check_lengths(prompts, request.sampling, info.max_model_len, "max_tokens")
    return engine_requests("cmpl-1", prompts, request.sampling, info, "gw")


def test_fan_out_n_with_seeds(info):
    requests = build(info, n=3, seed=10, max_tokens=5, prompt=["a", "b c"])
    assert [r.request_id for r in requests] == [f"cmpl-1-{i}" for i in range(6)]
    assert [r.sampling.seed for r in requests] == [10, 11, 12, 10, 11, 12]
    assert requests[0].prompt_token_ids == requests[2].prompt_token_ids
    assert requests[3].prompt_token_ids == info.tokenizer.encode("b c")
    assert all(r.gateway_id == "gw" and r.arrival_time > 0 for r in requests)
    assert requests[0].sampling.eos_token_ids == info.eos_token_ids != ()
    for r in requests:
        r.sampling.validate()


def test_default_max_tokens_is_16_for_completions_and_the_rest_for_chat(info):
    (request,) = build(info, temperature=0)
    assert request.sampling.max_tokens == 16  # OpenAI's legacy completions and vLLM
    assert request.sampling.seed is None  # greedy: nothing to reproduce
    parsed = parse_chat_request({"messages": [{"role": "user", "content": "hello"}]})
    (prompt,) = tokenize_chat(parsed, info)
    (chat,) = engine_requests("c", [prompt], parsed.sampling, info, "gw")
    assert chat.sampling.max_tokens == info.max_model_len - len(prompt.token_ids)


def test_a_request_template_is_rendered_only_where_the_server_trusts_it(info):
    template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": template}
    parsed = parse_chat_request(body)
    with pytest.raises(APIError, match="trust-request-chat-template") as refused:
        tokenize_chat(parsed, info)
    assert refused.value.param == "chat_template"
    (prompt,) = tokenize_chat(parsed, info, trust_request_template=True)
    assert info.tokenizer.decode(prompt.token_ids) == "<hi>"


def test_max_tokens_0_is_refused_but_with_echo(info):
    with pytest.raises(APIError, match="at least 1"):
        build(info, max_tokens=0)
    (request,) = build(info, max_tokens=0, echo=True)
    assert request.sampling.max_tokens == 1  # generated and counted, not shown (vLLM)


def test_negative_and_large_seeds_are_distinct_int64(info):
    seeds = {build(info, seed=s, temperature=1)[0].sampling.seed for s in (-1, 2**63 - 1, 0)}
    assert len(seeds) == 3 and all(-(2**63) <= s < 2**63 for s in seeds)  # int64


def test_sampled_requests_without_a_seed_get_a_random_one_per_choice(info):
    # So that an engine crash regenerates the same tokens (see choice_seed).
    first = build(info, n=3, temperature=0.8, max_tokens=5)
    second = build(info, n=3, temperature=0.8, max_tokens=5)
    seeds = [r.sampling.seed for r in first + second]
    assert all(seed is not None and 0 <= seed < 2**63 for seed in seeds)
    assert len(set(seeds)) == 6  # choices differ, and so do requests


def test_too_long_says_both_numbers(info):
    with pytest.raises(APIError) as error:
        build(info, max_tokens=info.max_model_len + 1)
    message = error.value.message
    assert error.value.status == 400 and error.value.param == "max_tokens"
    num_prompt = len(info.tokenizer.encode("hi there"))
    assert message.startswith(
        f"This model's maximum context length is {info.max_model_len} tokens. However, you "
        f"requested {num_prompt + info.max_model_len + 1} tokens ({num_prompt} in the "
        f"messages, {info.max_model_len + 1} in the completion)."
    )


def test_a_prompt_that_leaves_less_than_max_tokens_caps_the_output(info):
    (request,) = build(info, max_tokens=info.max_model_len)
    num_prompt = len(info.tokenizer.encode("hi there"))
    assert request.sampling.max_tokens == info.max_model_len - num_prompt


def test_prompt_alone_too_long(info):
    with pytest.raises(APIError, match="maximum context length is 256 tokens"):
        build(info, prompt=[5] * info.max_model_len)


def test_token_ids_outside_the_vocabulary(info):
    with pytest.raises(APIError, match=f"outside \\[0, {info.vocab_size}\\)"):
        build(info, prompt=[1, info.vocab_size])
    with pytest.raises(APIError, match="stop_token_ids"):
        build(info, stop_token_ids=[info.vocab_size + 5])


def test_chat_template_with_generation_prompt(info):
    request = parse_chat_request({"messages": [{"role": "user", "content": "hello"}]})
    (prompt,) = tokenize_chat(request, info)
    text = info.tokenizer.decode(prompt.token_ids)
    assert text.endswith("<|im_start|>assistant\n") and "hello" in text
    # The template writes the special tokens: none added on top (no doubled first token).
    assert prompt.token_ids[0] != prompt.token_ids[1]
    assert text.count("<|im_start|>") == 3  # system (the template's default), user, assistant
