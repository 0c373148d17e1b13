"""vLLM's engine parameters through the whole pipeline and the official `openai` client:
`allowed_token_ids` and `bad_words` change greedy output exactly as the in-process engine
with the same masks does, `cache_salt` separates tenants' prefix caches, beam search
(`use_beam_search`, `best_of`, `n`, `length_penalty`) returns the engine's n best beams as n
choices, and bad values are 400s naming the parameter."""

from __future__ import annotations

import openai
import pytest

from pagedserve.services.gateway.engine_fields import bad_words_token_ids
from pagedserve.shared.protocol import SamplingParams
from tests.integration.pipeline.conftest import add_engine, add_gateway, wait_until_serving

PROMPT = "Paged attention stores the key"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, "engine-params")
    add_gateway(pipeline, "gw-params")
    wait_until_serving(pipeline)
    return pipeline


@pytest.fixture(scope="module")
def client(pipeline) -> openai.OpenAI:
    return pipeline.client()


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def complete(client, model, prompt=PROMPT, **extra):
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"return_token_ids": True, **extra},
    )  # fmt: skip


def reference(reference_engine, **fields) -> list[int]:
    (result,) = reference_engine.generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, **fields)
    )
    return result.token_ids


def token_ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_allowed_token_ids_restrict_the_output(client, model, reference_engine):
    free = token_ids(complete(client, model).choices[0])
    allowed = sorted({free[1], 10, 50, 120, 200} - {free[0]})
    masked = token_ids(complete(client, model, allowed_token_ids=allowed).choices[0])
    assert set(masked) <= set(allowed) and masked != free
    assert masked == reference(reference_engine, allowed_token_ids=tuple(allowed))


def test_bad_words_are_never_completed(client, model, reference_engine):
    tokenizer = reference_engine.tokenizer
    free = token_ids(complete(client, model).choices[0])
    # the first output token that is a word of its own (random weights also emit bytes of
    # unfinished characters, which no text tokenizes to)
    position, word = next(
        (i, tokenizer.decode([t]))
        for i, t in enumerate(free)
        if (t,) in bad_words_token_ids((tokenizer.decode([t]),), tokenizer)
    )
    banned = bad_words_token_ids((word,), tokenizer)
    masked = token_ids(complete(client, model, bad_words=[word]).choices[0])
    assert masked[:position] == free[:position] and masked[position] != free[position]
    assert masked == reference(reference_engine, bad_words_token_ids=banned)


def test_cache_salt_separates_tenants(client, model):
    prompt = PROMPT + " value cache in fixed size blocks. " * 4  # several full blocks

    def cached(salt):
        usage = complete(client, model, prompt=prompt, cache_salt=salt).usage
        return usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0  # the same tenant hits its own blocks
    assert cached("tenant-b") == 0  # another tenant hits none of them


@pytest.mark.parametrize("stream", [False, True])
def test_beam_search_returns_the_engines_best_beams(client, model, reference_engine, stream):
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, beam_width=4, n=2, length_penalty=0.5
    )
    (expected,) = reference_engine.generate([PROMPT], params)
    texts = [reference_engine.tokenizer.decode(b.token_ids) for b in expected.beams]
    response = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, n=2, stream=stream,
        extra_body={"use_beam_search": True, "best_of": 4, "length_penalty": 0.5},
    )  # fmt: skip
    got = ["", ""]
    for chunk in response if stream else [response]:
        for choice in chunk.choices:
            got[choice.index] += choice.text
    assert got == texts
    assert texts[0] != texts[1]


def test_chat_beam_search_gives_n_choices(client, model):
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=MAX_TOKENS,
        n=3, extra_body={"use_beam_search": True},
    )  # fmt: skip
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in response.choices)
    assert response.usage.completion_tokens >= 3


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"allowed_token_ids": [10**6]}, "allowed_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": ["a"]}, "allowed_token_ids"),
        ({"bad_words": [" "]}, "bad_words"),
        ({"bad_words": "fox"}, "bad_words"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": 5}, "cache_salt"),
        ({"use_beam_search": "yes"}, "use_beam_search"),
        ({"use_beam_search": True, "best_of": 11}, "best_of"),
        ({"use_beam_search": True, "n": 3, "best_of": 2}, "best_of"),
        ({"use_beam_search": True, "logprobs": 1}, "logprobs"),
        ({"use_beam_search": True, "bad_words": ["fox"]}, "bad_words"),
        ({"best_of": 3}, "best_of"),
        ({"length_penalty": 2.0}, "length_penalty"),
        ({"use_beam_search": True, "length_penalty": "long"}, "length_penalty"),
    ],
)
def test_bad_values_are_400s_naming_the_parameter(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert excinfo.value.body["param"] == param, excinfo.value.body
