"""Happy paths through the official `openai` client, against the gateway and a scripted engine."""

from __future__ import annotations

import time

import openai
import pytest

from tests.integration.gateway.conftest import API_KEY, MODEL_NAME
from tests.integration.gateway.scripted_engine import DEFAULT_REPLY

pytestmark = pytest.mark.integration


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def test_models(client, info):
    (model,) = client.models.list().data
    assert model.id == MODEL_NAME


def test_completion_stream_equals_non_stream(client, gateway):
    full = client.completions.create(model=MODEL_NAME, prompt="Say hi", max_tokens=50)
    assert full.choices[0].text == DEFAULT_REPLY
    assert full.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt="Say hi", max_tokens=50, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.model_dump() == full.usage.model_dump()
    assert usage.prompt_tokens == len(gateway.engine.received[0].prompt_token_ids)
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    expected_cached = min(gateway.engine.num_cached_tokens, usage.prompt_tokens)
    assert usage.prompt_tokens_details.cached_tokens == expected_cached
    assert all(c.usage is None for c in chunks[:-1])


def test_max_tokens_gives_length(client, info):
    reply = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=3)
    assert reply.choices[0].finish_reason == "length"
    ids = info.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False)[:3]
    # a cut inside a character holds its bytes back (vLLM): no U+FFFD
    assert reply.choices[0].text == info.tokenizer.decode(ids).rstrip("\ufffd")
    assert reply.usage.completion_tokens == 3


def test_chat_stream_equals_non_stream(client, gateway, info):
    messages = [{"role": "user", "content": "hello"}]
    full = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=64, temperature=0
    )
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == DEFAULT_REPLY
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=64, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == DEFAULT_REPLY
    assert chunks[-1].choices[0].finish_reason == "stop"
    prompt = info.tokenizer.decode(gateway.engine.received[0].prompt_token_ids)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert gateway.engine.received[0].sampling.temperature == 0.0


def test_n_choices_with_seed(client, gateway):
    reply = client.completions.create(model=MODEL_NAME, prompt="p", n=3, seed=7, max_tokens=60)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.text == DEFAULT_REPLY for c in reply.choices)
    received = sorted(gateway.engine.received, key=lambda r: r.request_id)
    assert [r.sampling.seed for r in received] == [7, 8, 9]
    assert [r.request_id.rsplit("-", 1)[1] for r in received] == ["0", "1", "2"]
    assert reply.usage.completion_tokens == 3 * len(
        gateway.engine.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False)
    )


def test_batch_prompts_streamed(client):
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt=["a", [9, 10, 11]], n=2, max_tokens=60, stream=True
    ))  # fmt: skip
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {i: DEFAULT_REPLY for i in range(4)}


def test_completion_logprobs_shape(client, info):
    reply = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=4, logprobs=2)
    lp = reply.choices[0].logprobs
    ids = info.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False)[:4]
    # a byte of an unfinished character shows as "" and the character with its last byte
    assert lp.tokens == [info.token_text_after(t, ids[:i]) for i, t in enumerate(ids)]
    assert lp.token_logprobs == pytest.approx([-0.5, -0.6, -0.7, -0.8])
    assert len(lp.top_logprobs) == 4 and all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_shape(client, info):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=3,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = reply.choices[0].logprobs.content
    assert len(content) == 3
    first = content[0]
    assert first.logprob == pytest.approx(-0.5)
    assert bytes(first.bytes).decode() == first.token
    assert len(first.top_logprobs) == 3 and first.top_logprobs[0].token == first.token


def test_stop_string_across_tokens_aborts_upstream(client, gateway, info):
    # "Ça va" spans several tokens of the reply; the text before it is all the client sees.
    reply = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=60, stop=["Ça va"])
    assert reply.choices[0].text == "Hello! "
    assert reply.choices[0].finish_reason == "stop"
    deadline = time.monotonic() + 2
    while not gateway.engine.aborts and time.monotonic() < deadline:
        time.sleep(0.01)
    (_, abort), *_ = gateway.engine.aborts
    assert abort.request_ids == [gateway.engine.received[0].request_id]
    assert abort.reason == "stop"


def test_stop_string_streamed_is_never_shown(client):
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], stop="你好", stream=True,
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "Hello! Ça va? "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_params_reach_the_engine(client, gateway):
    client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=2, temperature=0.3, top_p=0.8,
        presence_penalty=0.5, frequency_penalty=0.25,
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": True,
                    "min_tokens": 1, "stop_token_ids": [7], "priority": 3},
    )  # fmt: skip
    (request,) = gateway.engine.received
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.3, 0.8, 5, 0.1)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, 0.25, 1.1)
    assert s.ignore_eos and s.min_tokens == 1 and s.stop_token_ids == (7,)
    assert request.priority == 3 and s.max_tokens == 2
