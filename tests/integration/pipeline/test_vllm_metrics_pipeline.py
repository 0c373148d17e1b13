"""vLLM's metric families through the whole pipeline: real requests on the tiny served model,
then /metrics scraped and checked family by family, each value against another the engine or
the gateway counts independently. The engine has few KV blocks (so requests are preempted),
follows every block (`--kv-cache-metrics-sample 1`) and speculates 2 tokens."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.shared.metric_buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    KV_CACHE_RESIDENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
)
from tests.integration.pipeline.conftest import add_engine, add_gateway, wait_until_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE_ID = "engine-metrics"
NUM_BLOCKS = 24  # 192 tokens of KV: six requests of ~110 tokens cannot all stay
CONCURRENT = 6
REPEATS = 3
ALONE = 1  # the drafting prompt, alone at the end
NUM_REQUESTS = CONCURRENT + REPEATS + ALONE
REPEATED = "one two three four one two three four one two three four one two three four"
# families vLLM 0.32 shows on a CPU engine with these flags, and their types
FAMILIES = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge", "vllm:engine_sleep_state": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter", "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter", "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_cached_by_source": "counter", "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter", "vllm:admission_rejections": "counter",
    "vllm:spec_decode_num_drafts": "counter", "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
    **{f"vllm:{name}": "histogram" for name in (
        "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
        "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
        "time_to_first_token_seconds", "inter_token_latency_seconds",
        "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_inference_time_seconds",
        "request_prefill_time_seconds", "request_decode_time_seconds",
        "request_num_preemptions", "request_prefill_kv_computed_tokens",
        "kv_block_lifetime_seconds", "kv_block_idle_before_evict_seconds",
        "kv_block_reuse_gap_seconds")},
}  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, ENGINE_ID, 1, "--kv-cache-metrics", "--kv-cache-metrics-sample", "1",
               "--num-speculative-tokens", "2", num_blocks=NUM_BLOCKS)  # fmt: skip
    add_gateway(pipeline, "gw-metrics")
    wait_until_serving(pipeline)
    return pipeline


def scrape(pipeline) -> dict:
    text = httpx.get(f"{pipeline.base_url()}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, suffix: str = "", **labels: str) -> float:
    """The sum of `name`'s samples (`suffix`: "_total", "_sum", "_count") with these labels."""
    family = families[name.removesuffix("_total")] if name.endswith("_total") else families[name]
    wanted = (name if name.endswith("_total") else name + suffix) if suffix else name
    samples = [s for s in family.samples if s.name == wanted
               and all(s.labels.get(k) == v for k, v in labels.items())]  # fmt: skip
    assert samples, f"no sample {wanted} {labels}"
    return sum(s.value for s in samples)


def bounds(families: dict, name: str) -> list[float]:
    first = next(s for s in families[name].samples if s.name == name + "_bucket")
    same = [s for s in families[name].samples if s.name == name + "_bucket"
            and s.labels["engine"] == first.labels["engine"]]  # fmt: skip
    return [float(s.labels["le"]) for s in same if s.labels["le"] != "+Inf"]


def concurrent_prompt(i: int) -> str:
    return f"request {i}: " + "the pages of attention " * 5


async def send_all(pipeline, model: str) -> None:
    """The repeats first (the later ones hit the first's blocks, twice: a reuse gap), then six
    at once, which preempt each other and evict every block, the repeats' included; then one
    alone that drafts. Drafts come only in pure decode steps, which the six get or not as
    their arrivals fall (CI saw none); the tiny model's greedy answer to the fifth prompt,
    alone, repeats bigrams (5 drafted steps in fp32, in-process)."""
    client = pipeline.async_client()
    for _ in range(REPEATS):
        await client.completions.create(model=model, prompt=REPEATED, max_tokens=12,
                                        temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    prompts = [concurrent_prompt(i) for i in range(CONCURRENT)]
    await asyncio.gather(*(
        client.completions.create(model=model, prompt=p, max_tokens=80, temperature=0,
                                  extra_body={"ignore_eos": True})
        for p in prompts
    ))  # fmt: skip
    await client.completions.create(model=model, prompt=concurrent_prompt(4), max_tokens=80,
                                    temperature=0, extra_body={"ignore_eos": True})  # fmt: skip


def test_the_vllm_families_move_with_real_requests(pipeline):
    model = pipeline.client().models.list().data[0].id
    before = scrape(pipeline)
    for name, kind in FAMILIES.items():
        if not name.startswith("vllm:kv_block_"):  # shown once a block was evicted
            assert name in before and before[name].type == kind, name
    asyncio.run(send_all(pipeline, model))
    after = wait_for_engine_times(pipeline, NUM_REQUESTS, time.time())
    for name, kind in FAMILIES.items():
        assert name in after and after[name].type == kind, name
    check_preemptions(after)
    check_prompt_sources(after)
    check_speculation(after)
    check_block_residency(after)
    check_times_and_bounds(after)


def wait_for_engine_times(pipeline, num_requests: int, answered_at: float) -> dict:
    """/metrics once the engine-time histograms (observed after a Redis read that follows the
    response) and the engine's status record (written every second: preemptions, drafts)
    caught up with the last answer, received at `answered_at`."""
    deadline = time.monotonic() + 20
    while True:
        fresh = pipeline.engine_status(ENGINE_ID).time > answered_at
        families = scrape(pipeline)
        done = value(families, "vllm:request_queue_time_seconds", "_count") >= num_requests
        if (fresh and done) or time.monotonic() > deadline:
            return families
        time.sleep(0.2)


def check_preemptions(families: dict) -> None:
    preempted = value(families, "vllm:num_preemptions_total", engine=ENGINE_ID)
    assert preempted > 0, "six requests on 24 blocks should have preempted some"
    # each preemption is some finished request's: the per-request counts add up to the total
    assert value(families, "vllm:request_num_preemptions", "_sum") == preempted
    assert value(families, "vllm:request_num_preemptions", "_count") == NUM_REQUESTS


def check_prompt_sources(families: dict) -> None:
    prompt = value(families, "vllm:prompt_tokens_total", engine=ENGINE_ID)
    cached = value(families, "vllm:prompt_tokens_cached_total", engine=ENGINE_ID)
    assert cached > 0, "the repeated prompt should have hit the prefix cache"
    by_source = {
        source: value(families, "vllm:prompt_tokens_by_source_total", source=source)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    assert by_source == {"local_compute": prompt - cached, "local_cache_hit": cached,
                         "external_kv_transfer": 0}  # fmt: skip
    assert value(families, "vllm:request_prefill_kv_computed_tokens", "_sum") == prompt - cached
    hits = value(families, "vllm:prefix_cache_hits_total", engine=ENGINE_ID)
    assert value(families, "vllm:prompt_tokens_cached_by_source_total", source="device") == hits
    assert value(families, "vllm:prompt_tokens_cached_by_source_total", source="host") == 0
    assert value(families, "vllm:engine_sleep_state", sleep_state="awake") == 1


def check_speculation(families: dict) -> None:
    accepted = value(families, "vllm:spec_decode_num_accepted_tokens_total")
    assert value(families, "vllm:spec_decode_num_drafts_total") > 0
    positions = {s.labels["position"]: s.value for s in
                 families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                 if s.name.endswith("_total")}  # fmt: skip
    assert set(positions) == {"0", "1"} and sum(positions.values()) == accepted
    assert positions["0"] >= positions["1"]  # drafts are accepted as a prefix


def check_block_residency(families: dict) -> None:
    evicted = value(families, "vllm:kv_block_lifetime_seconds", "_count")
    assert evicted > 0, "24 blocks for ~700 tokens of requests: blocks were evicted"
    assert value(families, "vllm:kv_block_idle_before_evict_seconds", "_count") == evicted
    assert value(families, "vllm:kv_block_reuse_gap_seconds", "_count") > 0
    lifetime = value(families, "vllm:kv_block_lifetime_seconds", "_sum")
    assert lifetime >= value(families, "vllm:kv_block_idle_before_evict_seconds", "_sum") > 0
    assert bounds(families, "vllm:kv_block_lifetime_seconds") == list(KV_CACHE_RESIDENCY_BUCKETS)


def check_times_and_bounds(families: dict) -> None:
    tpot = "vllm:request_time_per_output_token_seconds"
    assert value(families, tpot, "_count") == NUM_REQUESTS
    assert value(families, tpot, "_sum") > 0
    assert bounds(families, tpot) == list(INTER_TOKEN_LATENCY_BUCKETS)
    assert bounds(families, "vllm:time_to_first_token_seconds") == list(TIME_TO_FIRST_TOKEN_BUCKETS)
    assert bounds(families, "vllm:e2e_request_latency_seconds") == list(REQUEST_LATENCY_BUCKETS)
    success = value(families, "vllm:request_success_total", finished_reason="length")
    assert success == NUM_REQUESTS
