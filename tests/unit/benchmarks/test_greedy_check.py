"""The identical-output check: texts streamed from each server, compared request by request,
a mismatch named with where the texts part."""

from __future__ import annotations

import pytest

from benchmarks.greedy_check import check_summary, compare_texts, first_difference, greedy_texts
from benchmarks.transformers_serve import TransformersServeEndpoint
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import BenchRequest
from tests.unit.benchmarks.fake_openai_server import fake_openai_server

REQUESTS = [BenchRequest(" the cat", [2, 3], 3), BenchRequest(" the dog", [2, 9], 1)]


def test_first_difference() -> None:
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2  # a prefix parts where it ends
    assert first_difference("", "x") == 0


def test_compare_names_each_mismatch_and_where() -> None:
    mismatches = compare_texts(["same", " the cat sat", "x"], ["same", " the cat ran", "x"])
    assert [(m.index, m.first_difference, m.ours, m.theirs) for m in mismatches] == [
        (1, 9, "sat", "ran")
    ]
    summary = check_summary(["a", "b"], ["a", "c"])
    assert summary["num_requests"] == 2 and summary["num_identical"] == 1
    assert summary["mismatches"][0]["index"] == 1


def test_different_numbers_of_texts_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 texts against 1"):
        compare_texts(["a", "b"], ["a"])


def test_texts_are_streamed_whole_from_both_kinds_of_server() -> None:
    with fake_openai_server() as ours, fake_openai_server(send_done=False) as theirs:
        a = greedy_texts(EndpointConfig(ours.base_url, "m"), REQUESTS)
        b = greedy_texts(TransformersServeEndpoint(theirs.base_url, "m"), REQUESTS)
    assert a == b == [" x x x", " x"]
    assert check_summary(a, b)["num_identical"] == 2


def test_an_unreachable_server_raises_instead_of_giving_texts() -> None:
    from pagedserve.services.cli.ports import free_port

    with pytest.raises(ConnectionRefusedError):
        greedy_texts(EndpointConfig(f"http://127.0.0.1:{free_port()}", "m"), REQUESTS)
