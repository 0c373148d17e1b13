"""vLLM's extra parameters: what each reads to, and the 400 (naming it) for a bad value or a
parameter this server cannot honour."""

from __future__ import annotations

import pytest

from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.openai_schema import parse_chat_request, parse_completion_request
from pagedserve.services.gateway.request_builder import tokenize_chat, tokenize_completion

MESSAGES = [{"role": "user", "content": "hi"}]


def completion(**fields):
    return parse_completion_request({"prompt": "hi", **fields})


def refused(parse, param: str, fragment: str, **fields) -> None:
    body = {"prompt": "hi", **fields} if parse is parse_completion_request else {
        "messages": MESSAGES, **fields}  # fmt: skip
    with pytest.raises(APIError) as error:
        parse(body)
    assert error.value.status == 400 and error.value.param == param
    assert fragment in error.value.message, error.value.message


def test_defaults_change_nothing():
    output = completion().output
    assert (output.echo, output.prompt_logprobs, output.return_token_ids) == (False, None, False)
    assert output.skip_special_tokens and not output.include_stop_str_in_output
    assert completion().sampling.prompt_logprobs is None and completion().sampling.logit_bias == ()


def test_echo_with_logprobs_asks_the_engine_for_prompt_logprobs():
    assert completion(echo=True, logprobs=2).sampling.prompt_logprobs == 2
    assert completion(echo=True).sampling.prompt_logprobs is None
    assert completion(echo=True, logprobs=1, prompt_logprobs=5).sampling.prompt_logprobs == 5
    chat = parse_chat_request({"messages": MESSAGES, "echo": True, "logprobs": True})
    assert chat.sampling.prompt_logprobs is None  # chat's echo repeats text only


@pytest.mark.parametrize(
    ("param", "value", "fragment"),
    [
        ("prompt_logprobs", 21, "<= 20"),
        ("prompt_logprobs", -1, ">= 0"),
        ("truncate_prompt_tokens", 0, "-1 (the model's limit) or >= 1"),
        ("logit_bias", {"x": 1}, "token ids"),
        ("logit_bias", {"1": "a"}, "must be a number"),
        ("logit_bias", [1], "must be an object"),
        ("return_token_ids", "yes", "boolean"),
        ("use_beam_search", "yes", "boolean"),
        ("bad_words", [""], "1 to 256 characters"),
        ("allowed_token_ids", [], "must not be empty"),
        ("cache_salt", "", "non-empty string"),
        ("length_penalty", 2.0, "only with `use_beam_search`"),
        ("spaces_between_special_tokens", "no", "boolean"),
        ("response_format", "json", "must be an object"),
    ],
)
def test_bad_values_and_unsupported_parameters_are_refused(param, value, fragment):
    refused(parse_completion_request, param, fragment, **{param: value})


def test_values_that_mean_off_are_accepted():
    completion(use_beam_search=False, length_penalty=1.0, bad_words=[], allowed_token_ids=None,
               spaces_between_special_tokens=True)  # fmt: skip


def test_chat_template_parameters():
    refused(parse_chat_request, "continue_final_message", "cannot both be true",
            continue_final_message=True)  # fmt: skip
    refused(parse_chat_request, "chat_template_kwargs", "may not set",
            chat_template_kwargs={"tokenize": True})  # fmt: skip
    request = parse_chat_request({"messages": MESSAGES, "chat_template_kwargs": {"x": 1}})
    assert request.chat_template_kwargs == {"x": 1}


def test_add_special_tokens_and_truncation_shape_the_prompt(info):
    request = completion(prompt="a b c d e f", truncate_prompt_tokens=2)
    (prompt,) = tokenize_completion(request, info)
    assert prompt.token_ids == info.tokenizer.encode("a b c d e f")[-2:]
    chat = parse_chat_request({"messages": MESSAGES, "add_special_tokens": True})
    plain = parse_chat_request({"messages": MESSAGES})
    with_special = tokenize_chat(chat, info)[0].token_ids
    without = tokenize_chat(plain, info)[0].token_ids
    if info.tokenizer.bos_token_id is not None and info.tokenizer.add_bos_token:
        assert with_special[0] == info.tokenizer.bos_token_id != without[0]
    else:  # this tokenizer adds nothing: both ways agree
        assert with_special == without
