from __future__ import annotations

from pagedserve.services.gateway.logprob_formatter import (
    MIN_LOGPROB,
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
)
from pagedserve.services.gateway.output_processor import ChoiceProcessor
from pagedserve.shared.protocol import TokenDelta

ENTRIES = [
    TokenLogprob("Hi", -0.1, [("Hi", -0.1), ("Hey", -2.5)], 0),
    TokenLogprob(" é", float("-inf"), [("!", -0.3)], 2),
]


def test_completion_shape():
    body = completion_logprobs(ENTRIES)
    assert body == {
        "tokens": ["Hi", " é"],
        "token_logprobs": [-0.1, MIN_LOGPROB],
        "top_logprobs": [{"Hi": -0.1, "Hey": -2.5}, {" é": MIN_LOGPROB, "!": -0.3}],
        "text_offset": [0, 2],
    }


def test_chat_shape():
    body = chat_logprobs(ENTRIES)
    first, second = body["content"]
    assert first == {
        "token": "Hi", "logprob": -0.1, "bytes": [72, 105],
        "top_logprobs": [
            {"token": "Hi", "logprob": -0.1, "bytes": [72, 105]},
            {"token": "Hey", "logprob": -2.5, "bytes": [72, 101, 121]},
        ],
    }  # fmt: skip
    assert second["bytes"] == [32, 195, 169] and second["logprob"] == MIN_LOGPROB


def test_processor_builds_entries_with_offsets(info):
    ids = info.tokenizer.encode("Hi there", add_special_tokens=False)
    processor = ChoiceProcessor(info, (), want_logprobs=True)
    delta = TokenDelta(
        "r", ids, logprobs=[-1.0] * len(ids),
        top_logprobs=[[(t, -1.0), (0, -5.0)] for t in ids], finish_reason="stop",
    )  # fmt: skip
    update = processor.process(delta)
    assert [e.token for e in update.logprobs] == [info.token_text(t) for t in ids]
    assert "".join(e.token for e in update.logprobs) == "Hi there"
    offsets = [e.text_offset for e in update.logprobs]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < len("Hi there")
    assert update.logprobs[0].top[1] == (info.token_text(0), -5.0)
