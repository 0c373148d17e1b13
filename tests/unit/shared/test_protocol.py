from __future__ import annotations

import msgpack
import pytest

from pagedserve.shared.protocol import (
    AbortRequest,
    CachedSequence,
    GenerateRequest,
    Heartbeat,
    NewSequence,
    OutputBatch,
    ProtocolError,
    SamplingParams,
    Shutdown,
    StepPlan,
    StepResult,
    TokenDelta,
    WorkerHello,
    decode,
    encode,
)


def make_plan() -> StepPlan:
    sampling = SamplingParams(temperature=0.7, top_k=5, seed=3, stop_token_ids=(2, 9))
    return StepPlan(
        step_id=7,
        new_seqs=[
            NewSequence(
                seq_id="a",
                token_ids=[1, 2, 3],
                num_prompt_tokens=3,
                num_computed_tokens=0,
                num_scheduled_tokens=3,
                block_ids=[4, 0],
                sampling=sampling,
            )
        ],
        cached_seqs=[CachedSequence("b", [11], [5], 32, 1)],
        finished_seq_ids=["c"],
        preempted_seq_ids=["d"],
    )


@pytest.mark.parametrize(
    "message",
    [
        make_plan(),
        GenerateRequest("r1", [1, 2], SamplingParams(max_tokens=4), "gw", 1.5, 2),
        AbortRequest(["r1", "r2"], "client disconnected"),
        OutputBatch("e1", [TokenDelta("r1", [5, 6], [-0.1, -0.2], None, "stop", None, None, 2, 2)]),
        StepResult(7, ["a", "b"], [10, 11], [-0.5, -1.0], [[[10, -0.5]], [[11, -1.0]]]),
        WorkerHello(0, 2, 100, 16, 2048, "tiny", 42, max_num_batched_tokens=512, vocab_size=99),
        WorkerHello(0, 1, 100, 16, 2048, "tiny", 42, sliding_windows=[4096, None, 4096]),
        Heartbeat(role="worker", time=12.5, step_id=3, rank=1),
        Heartbeat(role="scheduler", time=12.5, step_id=4, epoch="abc123"),
        Shutdown("bye"),
    ],
)
def test_round_trip_preserves_every_field(message):
    assert decode(encode(message)) == message


def test_tuple_fields_come_back_as_tuples():
    params = decode(encode(SamplingParams(stop_token_ids=(1, 2))))
    assert params.stop_token_ids == (1, 2)
    assert isinstance(params.stop_token_ids, tuple)


def test_plan_counts_scheduled_tokens():
    assert make_plan().num_scheduled_tokens == 4
    assert StepPlan(step_id=0).is_empty


def test_unknown_tag_is_rejected():
    with pytest.raises(ProtocolError, match="unknown message tag 99"):
        decode(msgpack.packb(msgpack.ExtType(99, b"\x90")))


def test_wrong_field_count_is_rejected():
    with pytest.raises(ProtocolError, match="Heartbeat needs 5 fields"):
        decode(msgpack.packb(msgpack.ExtType(12, msgpack.packb([1]))))


def test_garbage_is_rejected():
    with pytest.raises(ProtocolError):
        decode(b"\xc1\xff\x00")


def test_non_messages_are_not_encoded():
    with pytest.raises(ProtocolError, match="not a protocol message"):
        encode(object())


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(temperature=-1), "temperature must be >= 0"),
        (SamplingParams(top_p=0), "top_p must be in (0, 1]"),
        (SamplingParams(top_k=-2), "top_k must be -1 or 0 (disabled)"),
        (SamplingParams(max_tokens=-1), "max_tokens must be >= 0"),
        (SamplingParams(prompt_logprobs=21), "prompt_logprobs must be in [0, 20]"),
        (SamplingParams(max_tokens=2, min_tokens=3), "min_tokens must be in [0, max_tokens=2]"),
        (SamplingParams(logprobs=21), "logprobs must be in [0, 20]"),
    ],
)
def test_sampling_params_say_what_is_wrong(params, message):
    with pytest.raises(ValueError) as info:
        params.validate()
    assert message in str(info.value)


def test_new_fields_round_trip():
    from pagedserve.shared.protocol import PromptLogprobs, StepResult, TokenDelta

    params = SamplingParams(prompt_logprobs=2, logit_bias=((5, -1.5), (7, 100.0)), top_k=0)
    params.validate()
    assert decode(encode(params)) == params
    prompt = PromptLogprobs([-1.0, -2.5], [1, 3], [[(4, -0.5)], [(9, -0.1), (3, -2.0)]])
    delta = TokenDelta("r", [1], stop_token_id=2, prompt_logprobs=prompt)
    back = decode(encode(delta))
    assert back.prompt_logprobs.token_logprobs == [-1.0, -2.5]
    assert [list(map(tuple, t)) for t in back.prompt_logprobs.top_logprobs] == [
        [(4, -0.5)],
        [(9, -0.1), (3, -2.0)],
    ]
    result = decode(encode(StepResult(3, ["r"], [1], prompt_logprobs=[prompt])))
    assert result.prompt_logprobs[0].ranks == [1, 3]
