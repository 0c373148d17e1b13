"""What a vLLM user's requests expect, through the official `openai` client (httpx where the
client has no field), against the gateway and the scripted engine: API defaults, every
vLLM extra parameter honoured, vLLM's error words."""

from __future__ import annotations

import re

import openai
import pytest

from tests.integration.gateway.conftest import API_KEY, MODEL_NAME
from tests.integration.gateway.scripted_engine import DEFAULT_REPLY, SCRIPTED_EOS

pytestmark = pytest.mark.integration


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def reply_ids(info) -> list[int]:
    return info.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False)


def test_completions_default_to_16_tokens_and_chat_to_what_is_left(client, gateway, info):
    client.completions.create(model=MODEL_NAME, prompt="hello")
    messages = [{"role": "user", "content": "hello"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages)
    completion, chat = gateway.engine.received
    assert completion.sampling.max_tokens == 16
    assert chat.sampling.max_tokens == info.max_model_len - len(chat.prompt_token_ids)


def test_response_format_text_is_a_no_op(client):
    reply = client.completions.create(
        model=MODEL_NAME,
        prompt="x",
        max_tokens=50,
        extra_body={"response_format": {"type": "text"}},
    )
    assert reply.choices[0].text == DEFAULT_REPLY
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
        response_format={"type": "text"},
    )  # fmt: skip
    assert chat.choices[0].message.content == DEFAULT_REPLY


def test_the_sampled_stop_token_counts_in_usage_and_metrics(client, gateway, info):
    reply = client.completions.create(model=MODEL_NAME, prompt="[eos] hi", max_tokens=50)
    assert reply.choices[0].text == DEFAULT_REPLY and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == len(reply_ids(info)) + 1  # the EOS too
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt="[eos] hi", max_tokens=50, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    assert chunks[-1].usage.completion_tokens == len(reply_ids(info)) + 1
    with gateway.client() as c:
        metrics = c.get("/metrics").text
    (total,) = re.findall(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", metrics, re.M)
    assert float(total) == 2 * (len(reply_ids(info)) + 1)


def test_seeds_are_any_int64(client, gateway):
    for seed in (-(2**63), -1, 2**63 - 1):
        client.completions.create(model=MODEL_NAME, prompt="x", seed=seed, max_tokens=2)
    seeds = [r.sampling.seed for r in gateway.engine.received]
    assert seeds == [-(2**63), -1, 2**63 - 1]  # int64 end to end


def test_context_length_error_in_vllms_words(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL_NAME, prompt=[5] * 200, max_tokens=300)
    message = error.value.body["message"]
    assert re.search(r"maximum context length is (\d+) tokens", message)[1] == "256"
    assert "However, you requested 500 tokens (200 in the messages, 300 in the completion)" in (
        message
    )


def test_models_retrieve(client):
    card = client.models.retrieve(MODEL_NAME)
    assert card.id == MODEL_NAME and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_logit_bias_reaches_the_engine_and_is_checked(client, gateway, info):
    client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=2, logit_bias={"42": -100, "7": 2.5}
    )
    assert gateway.engine.received[0].sampling.logit_bias == ((42, -100.0), (7, 2.5))
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(
            model=MODEL_NAME, prompt="x", logit_bias={str(info.vocab_size): 1}
        )
    with pytest.raises(openai.BadRequestError, match="<= 100"):
        client.completions.create(model=MODEL_NAME, prompt="x", logit_bias={"1": 101})


def test_echo_with_logprobs_and_max_tokens_0_is_lm_eval_loglikelihood(client, info):
    prompt_ids = info.tokenizer.encode("The cat sat on the mat")
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompt_ids, echo=True, max_tokens=0, logprobs=1, temperature=0
    )
    (choice,) = reply.choices
    assert choice.text == info.tokenizer.decode(prompt_ids)
    logprobs = choice.logprobs
    assert logprobs.tokens == [info.token_text(t) for t in prompt_ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = [-1.0 - i / 10 for i in range(len(prompt_ids) - 1)]  # the scripted engine's
    assert logprobs.token_logprobs[1:] == pytest.approx(expected)
    assert all(len(top) == 2 for top in logprobs.top_logprobs[1:])  # the token and the best
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    # the one token vLLM generates for it is counted, not shown
    assert reply.usage.completion_tokens == 1 and reply.usage.prompt_tokens == len(prompt_ids)


def test_echo_prepends_the_prompt_and_its_logprobs_to_the_completion(client, info):
    reply = client.completions.create(
        model=MODEL_NAME, prompt="Say hi", echo=True, max_tokens=50, logprobs=0
    )
    (choice,) = reply.choices
    assert choice.text == "Say hi" + DEFAULT_REPLY
    num_prompt = len(info.tokenizer.encode("Say hi"))
    assert len(choice.logprobs.tokens) == num_prompt + len(reply_ids(info))
    stream = client.completions.create(
        model=MODEL_NAME, prompt="Say hi", echo=True, max_tokens=50, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == "Say hi" + DEFAULT_REPLY


def test_prompt_logprobs_in_vllms_shape(client, info):
    prompt_ids = info.tokenizer.encode("one two three")
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompt_ids, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    entries = reply.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(prompt_ids)
    second = entries[1]
    own = second[str(prompt_ids[1])]
    assert own["logprob"] == pytest.approx(-1.0) and own["rank"] == 1
    assert set(second) == {str(prompt_ids[1]), "100", "101"}
    assert second["101"]["rank"] == 2 and second["101"]["decoded_token"] == info.token_text(101)
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )  # fmt: skip
    assert chat.model_extra["prompt_logprobs"][0] is None
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(
            model=MODEL_NAME, prompt="x", stream=True, extra_body={"prompt_logprobs": 1}
        )


def test_return_token_ids(client, info):
    reply = client.completions.create(
        model=MODEL_NAME, prompt="[eos] hi", max_tokens=50, extra_body={"return_token_ids": True}
    )
    choice = reply.choices[0].model_extra
    assert choice["token_ids"] == [*reply_ids(info), SCRIPTED_EOS]
    assert choice["prompt_token_ids"] == info.tokenizer.encode("[eos] hi")
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=50,
        stream=True, extra_body={"return_token_ids": True},
    ))  # fmt: skip
    streamed = [t for c in chunks[1:] for t in c.choices[0].model_extra["token_ids"]]
    assert streamed == reply_ids(info)
    assert chunks[1].model_extra["prompt_token_ids"]


def test_continuous_usage_stats_put_usage_in_every_chunk(client, info):
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt="hi", max_tokens=50, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    ))  # fmt: skip
    counts = [c.usage.completion_tokens for c in chunks[:-1]]
    assert counts == sorted(counts) and counts[-1] == len(reply_ids(info))
    assert all(c.usage.prompt_tokens == len(info.tokenizer.encode("hi")) for c in chunks)


def test_include_stop_str_in_output_and_skip_special_tokens(client):
    cut = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=50, stop=["world"])
    kept = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=50, stop=["world"],
        extra_body={"include_stop_str_in_output": True},
    )  # fmt: skip
    assert kept.choices[0].text == cut.choices[0].text + "world"
    shown = client.completions.create(
        model=MODEL_NAME, prompt="[eos] x", max_tokens=50,
        extra_body={"include_stop_str_in_output": True, "skip_special_tokens": False},
    )  # fmt: skip
    assert shown.choices[0].text == DEFAULT_REPLY + "<|im_end|>"
    hidden = client.completions.create(
        model=MODEL_NAME, prompt="[eos] x", max_tokens=50,
        extra_body={"include_stop_str_in_output": True},
    )  # fmt: skip
    assert hidden.choices[0].text == DEFAULT_REPLY


def test_truncate_prompt_tokens_keeps_the_last_ones(client, gateway, info):
    prompt = "one two three four five six seven"
    client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=1, extra_body={"truncate_prompt_tokens": 3}
    )
    assert gateway.engine.received[0].prompt_token_ids == info.tokenizer.encode(prompt)[-3:]


def test_chat_template_options(client, gateway, info):
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "It is"}]
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=50,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "echo": True},
    )  # fmt: skip
    assert reply.choices[0].message.content == "It is" + DEFAULT_REPLY
    continued = info.tokenizer.decode(gateway.engine.received[0].prompt_token_ids)
    assert continued.endswith("<|im_start|>assistant\nIt is")
    client.chat.completions.create(
        model=MODEL_NAME, messages=messages[:1], max_tokens=1,
        extra_body={"chat_template_kwargs": {"add_generation_prompt": False}},
    )  # fmt: skip
    plain = info.tokenizer.decode(gateway.engine.received[1].prompt_token_ids)
    assert plain.endswith("2+2?<|im_end|>\n")
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, extra_body={"continue_final_message": True}
        )
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages,
            extra_body={"chat_template_kwargs": {"tokenize": True}},
        )  # fmt: skip


def test_what_is_still_refused_names_the_parameter(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL_NAME, prompt="x", suffix="y")
    assert error.value.body["param"] == "suffix"
