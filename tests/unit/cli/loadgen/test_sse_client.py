from __future__ import annotations

import asyncio

import pytest

from pagedserve.services.cli.loadgen.latency_stats import RequestRecord
from pagedserve.services.cli.loadgen.sse_client import (
    DONE,
    EndpointConfig,
    StreamError,
    apply_event,
    chunk_text,
    parse_sse_line,
    sse_lines,
)
from pagedserve.services.cli.loadgen.workload import BenchRequest

COMPLETION_STREAM = """\
data: {"id":"c1","choices":[{"index":0,"text":"Hello","finish_reason":null}]}

: a comment line
data: {"id":"c1","choices":[{"index":0,"text":"","finish_reason":null}]}

data: {"id":"c1","choices":[{"index":0,"text":" world","finish_reason":"length"}]}

data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}

data: [DONE]

"""


def _replay(stream: str) -> tuple[RequestRecord, bool]:
    record = RequestRecord(3, 3)
    for now, line in enumerate(stream.splitlines()):
        if apply_event(parse_sse_line(line), record, float(now)):
            return record, True
    return record, False


def test_completion_stream_timings_and_usage() -> None:
    record, done = _replay(COMPLETION_STREAM)
    assert done
    assert record.chunk_times == [0.0, 5.0]  # the empty-text chunk is not a token arrival
    assert record.num_output_tokens == 3  # from usage, not the chunk count


def test_chat_chunks() -> None:
    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert chunk_text({"choices": [{"delta": {"content": "Hi"}}]}) == "Hi"
    assert chunk_text({"choices": [{"delta": None}]}) == ""
    assert chunk_text({"choices": []}) == ""


def test_line_parsing() -> None:
    assert parse_sse_line("data: [DONE]") is DONE
    assert parse_sse_line('data:{"a":1}') == {"a": 1}
    assert parse_sse_line("") is None
    assert parse_sse_line("event: ping") is None
    with pytest.raises(StreamError, match="malformed SSE data"):
        parse_sse_line("data: {not json")


def test_error_event_raises() -> None:
    record = RequestRecord(1, 1)
    with pytest.raises(StreamError, match="engine died"):
        apply_event({"error": {"message": "engine died", "code": 500}}, record, 0.0)


def test_request_bodies() -> None:
    request = BenchRequest(" the cat", [2, 3], 7)
    completions = EndpointConfig("http://h:1/v1/", "m", api_key="k")
    assert completions.url == "http://h:1/v1/completions"
    assert completions.headers == {"Authorization": "Bearer k"}
    body = completions.body(request)
    assert body["prompt"] == " the cat" and body["max_tokens"] == 7
    assert body["ignore_eos"] and body["stream"] and body["stream_options"]["include_usage"]
    chat = EndpointConfig("http://h:1", "m", endpoint="chat", ignore_eos=False)
    assert chat.url == "http://h:1/v1/chat/completions"
    chat_body = chat.body(request)
    assert chat_body["messages"] == [{"role": "user", "content": " the cat"}]
    assert "ignore_eos" not in chat_body and chat.headers == {}
    with pytest.raises(ValueError, match="endpoint"):
        EndpointConfig("http://h", "m", endpoint="embeddings")


def test_sse_lines_split_at_line_ends_only():
    event = 'data: {"text":"a\u2028b\x85c"}'.encode()
    chunks = [event[:9], event[9:] + b"\r", b"\ndata: [DONE]\n\n"]

    async def collect() -> list[str]:
        async def gen():
            for chunk in chunks:
                yield chunk

        return [line async for line in sse_lines(gen())]

    lines = asyncio.run(collect())
    assert [line for line in lines if line] == ['data: {"text":"a\u2028b\x85c"}', "data: [DONE]"]
