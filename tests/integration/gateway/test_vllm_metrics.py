"""The vLLM metrics beyond the basics: per-request sizes, parameters and phase times measured
by the gateway; tokens per step and the cache shape from the engines' status records."""

from __future__ import annotations

import re
import time

import pytest

from pagedserve.shared.iteration_histogram import IterationHistogram
from pagedserve.shared.status import EngineStatus
from tests.integration.gateway.scripted_engine import DEFAULT_REPLY
from tests.integration.gateway.test_health_metrics import publish, sample

pytestmark = pytest.mark.integration


def total(text: str, name: str) -> float:
    """The sum of `name`'s samples over every label set (engines, sources...)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith((name + "{", name + " "))]  # fmt: skip
    if not values:
        raise AssertionError(f"{name} not in /metrics")
    return sum(values)


def wait_for_sample(client, name: str, value: float, timeout_s: float = 20.0) -> str:
    """/metrics once `name` (summed over its label sets) reaches `value` (the engine-time
    histograms are observed after a Redis read that follows the response)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = client.get("/metrics").text
        if (name in text and total(text, name) >= value) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_request_histograms(gateway, info):
    reply_len = len(info.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False))
    with gateway.client() as c:
        c.post("/v1/completions", json={"prompt": "one two", "n": 2, "max_tokens": 4})
        c.post("/v1/completions", json={"prompt": "[eos] hi", "max_tokens": 50})
        text = wait_for_sample(c, "vllm:request_inference_time_seconds_count", 3)
    prompt_lens = 2 * len(info.tokenizer.encode("one two")) + len(info.tokenizer.encode("[eos] hi"))
    assert total(text, "vllm:request_prompt_tokens_count") == 3
    assert total(text, "vllm:request_prompt_tokens_sum") == prompt_lens
    assert total(text, "vllm:request_generation_tokens_sum") == 2 * 4 + reply_len + 1
    assert total(text, "vllm:request_params_n_sum") == 2 + 2 + 1
    assert total(text, "vllm:request_params_max_tokens_sum") == 4 + 4 + 50
    assert total(text, "vllm:request_max_num_generation_tokens_sum") == 4 + 4 + 50
    cached = 2 * min(3, len(info.tokenizer.encode("one two"))) + 3  # the scripted engine's 3
    assert total(text, "vllm:prompt_tokens_cached_total") == cached
    assert total(text, "vllm:request_time_per_output_token_seconds_count") == 3
    for phase in ("prefill", "decode", "inference"):
        assert sample(text, f"vllm:request_{phase}_time_seconds_count") == 3, phase
    inference = total(text, "vllm:request_inference_time_seconds_sum")
    decode = total(text, "vllm:request_decode_time_seconds_sum")
    assert inference >= decode > 0  # the scripted engine sleeps between tokens


def test_iteration_tokens_and_cache_config_from_the_engines(gateway):
    histograms = [IterationHistogram(), IterationHistogram()]
    for tokens in (1, 5, 100):
        histograms[0].observe(tokens)
    histograms[1].observe(3000)
    for index, histogram in enumerate(histograms):
        publish(gateway, EngineStatus(
            f"e{index}", time=time.time(), workers_alive=True, num_total_blocks=500 + index,
            block_size=16, iteration_tokens=histogram.encode(), num_waiting=2 + index,
        ))  # fmt: skip
    with gateway.client() as c:  # /metrics reads a view of Redis refreshed every 0.25 s
        text = wait_for_sample(c, "vllm:iteration_tokens_total_count", 4)
    assert total(text, "vllm:iteration_tokens_total_count") == 4
    assert total(text, "vllm:iteration_tokens_total_sum") == 3106
    buckets = dict(re.findall(r'^vllm:iteration_tokens_total_bucket\{engine="e0",le="([^"]+)",'
                              r'[^}]*\} (\S+)$', text, re.M))  # fmt: skip
    assert float(buckets["1.0"]) == 1 and float(buckets["8.0"]) == 2
    assert float(buckets["128.0"]) == 3 and float(buckets["+Inf"]) == 3
    assert re.search(r'^vllm:iteration_tokens_total_count\{engine="e1",[^}]*\} 1.0$', text, re.M)
    waiting = re.findall(r'^vllm:num_requests_waiting_by_reason\{engine="(\w+)",[^}]*'
                         r'reason="(\w+)"\} (\S+)$', text, re.M)  # fmt: skip
    assert sorted(waiting) == [("e0", "capacity", "2.0"), ("e0", "deferred", "0.0"),
                               ("e1", "capacity", "3.0"), ("e1", "deferred", "0.0")]  # fmt: skip
    infos = re.findall(r"^vllm:cache_config_info\{([^}]*)\} 1\.0$", text, re.M)
    assert len(infos) == 2
    assert all('block_size="16"' in labels for labels in infos)
    assert any('num_gpu_blocks="501"' in labels for labels in infos)
