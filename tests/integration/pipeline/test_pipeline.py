"""The whole pipeline through the official `openai` client: two gateway replicas, one engine
(scheduler + worker processes), a real Redis, the tiny served model."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from pagedserve.shared.protocol import SamplingParams
from tests.integration.pipeline.conftest import add_engine, add_gateway, wait_until_serving
from tests.integration.pipeline.served_model import MAX_MODEL_LEN

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE_ID = "engine-a"
MODEL = "served"
PROMPTS = ["The quick brown fox", "Paged attention stores", "Hello, world! How are"]
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=["sync", "async-scheduling"])
def pipeline(pipeline_factory, request):
    """Every test twice: steps planned one after the other, and with async scheduling (the
    next step planned while the last computes), which must answer the same."""
    pipeline = pipeline_factory()
    add_engine(pipeline, ENGINE_ID, 1, *(("--async-scheduling",) * (request.param != "sync")))
    add_gateway(pipeline, "gw-one")
    add_gateway(pipeline, "gw-two")
    wait_until_serving(pipeline)
    return pipeline


@pytest.fixture(scope="module")
def model_name(pipeline) -> str:
    return pipeline.client().models.list().data[0].id


def greedy_reference(reference_engine, prompts: list[str] | list[list[int]]) -> list[str]:
    results = reference_engine.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    )
    return [r.text for r in results]


def chat_prompt_ids(reference_engine, content: str) -> list[int]:
    tokenizer = reference_engine.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def stream_completion_text(client: openai.OpenAI, model: str, prompt: str, **kwargs) -> str:
    chunks = client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True, **kwargs
    )
    return "".join(c.choices[0].text for c in chunks if c.choices)


def test_completions_stream_equals_non_stream_equals_in_process_engine(
    pipeline, model_name, reference_engine
):
    client = pipeline.client()
    expected = greedy_reference(reference_engine, PROMPTS)
    for prompt, reference_text in zip(PROMPTS, expected, strict=True):
        full = client.completions.create(
            model=model_name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert full.choices[0].text == reference_text
        assert full.choices[0].finish_reason in ("stop", "length")
        assert stream_completion_text(client, model_name, prompt) == reference_text
    assert any(text for text in expected), "the reference produced only empty texts"


def test_chat_stream_equals_non_stream_equals_in_process_engine(
    pipeline, model_name, reference_engine
):
    client = pipeline.client(gateway=1)
    contents = ["hi there", "tell me about blocks"]
    expected = greedy_reference(
        reference_engine, [chat_prompt_ids(reference_engine, c) for c in contents]
    )
    for content, reference_text in zip(contents, expected, strict=True):
        messages = [{"role": "user", "content": content}]
        full = client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        assert full.choices[0].message.role == "assistant"
        assert full.choices[0].message.content == reference_text
        chunks = client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == reference_text


def test_n_choices_each_finish(pipeline, model_name):
    client = pipeline.client()
    full = client.completions.create(
        model=model_name, prompt=PROMPTS[0], max_tokens=6, temperature=1.0, n=3, seed=7
    )
    assert sorted(c.index for c in full.choices) == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in full.choices)
    chunks = list(
        client.completions.create(
            model=model_name, prompt=PROMPTS[0], max_tokens=6, temperature=1.0, n=2, stream=True
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_stop_string_cuts_the_text_and_finishes_with_stop(pipeline, model_name, reference_engine):
    client = pipeline.client()
    [reference_text] = greedy_reference(reference_engine, [PROMPTS[1]])
    assert len(reference_text) >= 4, f"reference text too short: {reference_text!r}"
    stop = reference_text[2:4]
    cut = reference_text[: reference_text.index(stop)]
    full = client.completions.create(
        model=model_name, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, stop=[stop]
    )
    assert full.choices[0].text == cut
    assert full.choices[0].finish_reason == "stop"
    assert stream_completion_text(client, model_name, PROMPTS[1], stop=[stop]) == cut


def test_logprobs_and_usage(pipeline, model_name, reference_engine):
    client = pipeline.client()
    full = client.completions.create(
        model=model_name, prompt=PROMPTS[2], max_tokens=5, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = full.choices[0]
    assert len(choice.logprobs.tokens) == full.usage.completion_tokens == 5
    assert all(lp <= 0.0 for lp in choice.logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in choice.logprobs.top_logprobs)
    assert "".join(choice.logprobs.tokens) == choice.text
    assert full.usage.prompt_tokens == len(reference_engine.encode(PROMPTS[2]))
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 4
    assert all(len(entry.top_logprobs) == 3 for entry in content)
    # Greedy: the sampled token is the most likely one.
    assert all(entry.logprob >= max(t.logprob for t in entry.top_logprobs) - 1e-5
               for entry in content)  # fmt: skip


def test_stream_include_usage_comes_last(pipeline, model_name, reference_engine):
    client = pipeline.client()
    chunks = list(
        client.completions.create(
            model=model_name, prompt=PROMPTS[0], max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == len(reference_engine.encode(PROMPTS[0]))
    assert all(c.usage is None for c in chunks[:-1])


def test_64_concurrent_streams_on_both_gateways_all_complete(
    pipeline, model_name, reference_engine
):
    prompts = [f"{PROMPTS[i % 3]} {i}" for i in range(64)]
    expected = greedy_reference(reference_engine, prompts)

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str | None]:
        stream = await client.completions.create(
            model=model_name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run_all() -> list[tuple[str, str | None]]:
        clients = [pipeline.async_client(0), pipeline.async_client(1)]
        try:
            return await asyncio.gather(*(one(clients[i % 2], p) for i, p in enumerate(prompts)))
        finally:
            for client in clients:
                await client.close()

    start = time.monotonic()
    results = asyncio.run(run_all())
    elapsed = time.monotonic() - start
    assert all(finish in ("stop", "length") for _, finish in results)
    assert [text for text, _ in results] == expected
    assert elapsed < 60, f"64 streams took {elapsed:.1f}s"


def test_client_disconnect_frees_blocks_within_a_second(pipeline, model_name):
    status = pipeline.engine_status(ENGINE_ID)
    total = status.num_total_blocks
    body = {
        "model": model_name, "prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0,
        "stream": True, "ignore_eos": True,
    }  # fmt: skip
    with httpx.Client(base_url=pipeline.base_url(), timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            request_id = None
            while request_id is None:
                line = next(lines)
                if line.startswith("data: {"):
                    request_id = line  # the first chunk: the request is running
        disconnected_at = time.time()
    # The engine's view, from its status hash (refreshed every second).
    deadline = time.monotonic() + 5
    while True:
        status = pipeline.engine_status(ENGINE_ID)
        if status.time > disconnected_at + 0.05 and status.num_running == 0:
            break
        assert time.monotonic() < deadline, f"still running after disconnect: {status}"
        time.sleep(0.1)
    assert status.num_free_blocks == total
    # The precise time: when the scheduler finished the request, from its status hash.
    aborted = [
        s for s in map(pipeline.request_status, _recent_request_ids(pipeline))
        if s.state == "aborted" and s.finished_at >= disconnected_at - 1
    ]  # fmt: skip
    assert aborted, "no aborted request recorded"
    assert aborted[0].finished_at - disconnected_at < 1.0
    assert aborted[0].num_output_tokens < 200


def _recent_request_ids(pipeline) -> list[str]:
    with pipeline.redis() as client:
        prefix = pipeline.keys.request("")
        return [k.decode()[len(prefix) :] for k in client.scan_iter(match=f"{prefix}*")]


def test_bad_input_gets_clear_400s_and_the_service_keeps_serving(
    pipeline, model_name, reference_engine
):
    client = pipeline.client()
    long_prompt = " ".join(["fox"] * (MAX_MODEL_LEN + 10))
    num_long = len(reference_engine.encode(long_prompt))
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(model=model_name, prompt=long_prompt, max_tokens=5)
    assert str(num_long) in str(excinfo.value) and str(MAX_MODEL_LEN) in str(excinfo.value)
    # max_tokens beyond the model's length is refused; within it, prompt + max_tokens past the
    # length caps the output (as vLLM), tests/integration/gateway/test_vllm_differences.py
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=MAX_MODEL_LEN + 1)
    assert "max_tokens" in str(excinfo.value) and str(MAX_MODEL_LEN) in str(excinfo.value)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=model_name, prompt="x", max_tokens=2, temperature=-1)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=model_name, messages=[], max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    [expected] = greedy_reference(reference_engine, [PROMPTS[0]])
    full = client.completions.create(
        model=model_name, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0
    )
    assert full.choices[0].text == expected
    assert pipeline.engine_status(ENGINE_ID).workers_alive
