"""The differential check's diffing, on canned answers (the real run needs vLLM's CPU
build, which CI does not install)."""

from __future__ import annotations

from benchmarks.vllm_diff import Difference, diff_answers


def completion(text: str, logprob: float, **extra: object) -> dict:
    choice = {"index": 0, "text": text, "logprobs": {"token_logprobs": [logprob]},
              "finish_reason": "stop", **extra}  # fmt: skip
    body = {"id": "cmpl-1", "created": 1, "object": "text_completion", "choices": [choice]}
    return {"status": 200, "body": body}


def test_equal_answers_but_ids_times_and_float_noise_have_no_difference():
    ours = completion("Paris", -0.12345)
    theirs = completion("Paris", -0.12349)
    theirs["body"]["id"], theirs["body"]["created"] = "cmpl-xyz", 99
    assert diff_answers(0, ours, theirs) == []


def test_values_missing_keys_and_lengths_are_reported_where_they_are():
    ours = completion("Paris", -0.1)
    theirs = completion("Paris.", -0.5, stop_reason=None)
    theirs["body"]["choices"].append(theirs["body"]["choices"][0])
    found = {d.path: (d.ours, d.theirs) for d in diff_answers(3, ours, theirs)}
    assert found == {
        "choices.length": (1, 2),
        "choices[0].text": ("Paris", "Paris."),
        "choices[0].logprobs.token_logprobs[0]": (-0.1, -0.5),
        "choices[0].stop_reason": ("<absent>", None),
    }


def test_a_status_difference_is_one_difference_and_error_words_are_not_compared():
    ok, refused = completion("a", 0.0), {"status": 400, "body": {"error": {"message": "x"}}}
    assert diff_answers(1, ok, refused) == [Difference(1, "status", 200, 400)]
    ours = {"status": 400, "body": {"error": {"message": "ours", "code": 400, "reason": "r"}}}
    theirs = {"status": 400, "body": {"error": {"message": "theirs", "code": 400}}}
    (only,) = diff_answers(2, ours, theirs)
    assert only.path == "error.reason" and only.documented


def test_an_integer_and_a_string_code_differ():
    ours = {"status": 404, "body": {"error": {"code": 404}}}
    theirs = {"status": 404, "body": {"error": {"code": "404"}}}
    assert [d.path for d in diff_answers(0, ours, theirs)] == ["error.code"]
