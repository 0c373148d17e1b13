"""A level measured again, with fresh words of the same lengths, while the hypervisor took too
much of the CPU: against a real streaming server on loopback, with the stolen share of each
attempt given by a scripted tick counter (the real one reads /proc/stat)."""

from __future__ import annotations

from collections.abc import Iterator

from benchmarks.steal_guard import StealGuard, run_guarded_levels
from pagedserve.services.cli.loadgen.runner import LoadConfig, plan_levels
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import LengthDistribution, synthetic_workload
from tests.unit.benchmarks.fake_openai_server import fake_openai_server
from tests.unit.benchmarks.fake_tokenizer import FakeTokenizer

PROMPTS = LengthDistribution(median=8, sigma=0.5, min_len=4, max_len=20)
OUTPUTS = LengthDistribution(median=3, sigma=0.5, min_len=2, max_len=6)
NUM_REQUESTS = 4


def scripted_ticks(steal_per_attempt: list[float]) -> Iterator[tuple[int, int]]:
    """(all, stolen) tick counts whose difference over attempt k steals `steal_per_attempt[k]`."""
    total = stolen = 0
    for share in steal_per_attempt:
        yield total, stolen
        total, stolen = total + 1000, stolen + round(1000 * share)
        yield total, stolen


def guarded_run(steal_per_attempt: list[float], max_attempts: int = 3):
    tokenizer = FakeTokenizer()
    requests = synthetic_workload(tokenizer, NUM_REQUESTS, PROMPTS, OUTPUTS, seed=1)
    levels = plan_levels(requests, tokenizer, [LoadConfig(max_concurrency=2)], 1, True)
    ticks = scripted_ticks(steal_per_attempt)
    guard = StealGuard(tokenizer, seed=1, max_steal=0.10, max_attempts=max_attempts,
                       ticks=lambda: next(ticks))  # fmt: skip
    with fake_openai_server() as server:
        runs = run_guarded_levels(EndpointConfig(server.base_url, "m"), levels, guard)
    return levels, runs, server.prompts


def test_a_quiet_level_is_measured_once() -> None:
    levels, runs, sent = guarded_run([0.02])
    assert runs[0]["steal_share"] == 0.02 and runs[0]["set_aside"] == []
    assert sorted(sent) == sorted(r.prompt for r in levels[0].requests)


def test_a_stolen_level_is_measured_again_with_fresh_words_of_the_same_lengths() -> None:
    _, runs, sent = guarded_run([0.30, 0.15, 0.04])
    run = runs[0]
    assert run["steal_share"] == 0.04 and run["num_completed"] == NUM_REQUESTS
    assert [a["steal_share"] for a in run["set_aside"]] == [0.30, 0.15]
    attempts = [sent[i * NUM_REQUESTS : (i + 1) * NUM_REQUESTS] for i in range(3)]
    assert len(sent) == 3 * NUM_REQUESTS
    assert all(set(a).isdisjoint(b) for a in attempts for b in attempts if a is not b)
    lengths = [sorted(len(p.split()) for p in a) for a in attempts]
    assert lengths[0] == lengths[1] == lengths[2]


def test_the_last_attempt_is_kept_however_much_was_stolen() -> None:
    _, runs, sent = guarded_run([0.40, 0.35], max_attempts=2)
    assert runs[0]["steal_share"] == 0.35 and len(runs[0]["set_aside"]) == 1
    assert len(sent) == 2 * NUM_REQUESTS


def test_without_a_guard_each_level_runs_once() -> None:
    tokenizer = FakeTokenizer()
    requests = synthetic_workload(tokenizer, NUM_REQUESTS, PROMPTS, OUTPUTS, seed=1)
    levels = plan_levels(requests, tokenizer, [LoadConfig(max_concurrency=2)], 1, True)
    with fake_openai_server() as server:
        runs = run_guarded_levels(EndpointConfig(server.base_url, "m"), levels, None)
    assert len(runs) == 1 and "set_aside" not in runs[0]


def test_any_run_goes_through_the_same_rule() -> None:
    """HF generate's run: the same requests again while too much was stolen."""
    ticks = scripted_ticks([0.5, 0.01])
    guard = StealGuard(FakeTokenizer(), seed=1, ticks=lambda: next(ticks))
    attempts: list[int] = []
    result = guard.measure(lambda attempt: attempts.append(attempt) or {"output_throughput": 9.0})
    assert attempts == [0, 1] and result["steal_share"] == 0.01
    assert result["set_aside"] == [{"output_throughput": 9.0, "steal_share": 0.5}]
