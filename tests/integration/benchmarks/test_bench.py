"""`pagedserve bench` against a real started pipeline (Redis, scheduler, worker, gateway as
processes) serving a tiny model: the JSON has every metric, no request failed, the engine
status was sampled from Redis, and no level of the sweep hit the prefix cache."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from pagedserve.services.cli import main
from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import EngineStatus, from_fields
from tests.integration.pipeline.served_model import build_served_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    model_dir = build_served_model(tmp_path_factory.mktemp("served"))
    config = PipelineConfig(model_dir, dtype="float32", max_num_seqs=8, worker_threads=1)
    log = (tmp_path_factory.mktemp("logs") / "pipeline.log").open("w")
    with LocalPipeline(config, log=log) as running:
        yield running, model_dir
    log.close()


def prefix_cache_hits(redis_url: str, namespace: str) -> int:
    """Prompt tokens found in the prefix cache so far, over every engine's status record."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = RedisKeys(namespace)
        records = [client.hgetall(keys.engine(e.decode())) for e in client.smembers(keys.engines)]
        return sum(from_fields(EngineStatus, r).prefix_cache_hits for r in records if r)
    finally:
        client.close()


def test_bench_reports_every_metric_without_failures(pipeline, tmp_path: Path) -> None:
    running, model_dir = pipeline
    out = tmp_path / "bench"
    code = main([
        "bench", "--base-url", running.base_url, "--model", str(model_dir),
        "--num-prompts", "6", "--prompt-len", "12", "--prompt-len-range", "4,40",
        "--output-len", "6", "--output-len-range", "2,12", "--seed", "3",
        "--concurrency-sweep", "1,4", "--redis-url", running.redis_url,
        "--namespace", running.namespace, "--num-warmups", "2", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["workload"]["num_requests"] == 6
    assert result["workload"]["text"] == "words"
    assert result["warmup"] == {"num_requests": 2, "num_failed": 0}
    assert [run["max_concurrency"] for run in result["runs"]] == [1, 4]
    assert [run["fresh_prompts"] for run in result["runs"]] == [True, True]
    for run in result["runs"]:
        assert run["num_completed"] == 6 and run["num_failed"] == 0
        assert run["num_wrong_length"] == 0  # ignore_eos + max_tokens: exact lengths
        assert run["total_output_tokens"] == result["workload"]["total_output_tokens"]
        assert run["output_throughput"] > 0 and run["request_throughput"] > 0
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(run[metric]) == {"mean", "p50", "p90", "p99"}
            assert 0 < run[metric]["p50"] <= run[metric]["p99"]
        assert len(run["records"]) == 6
    assert any(run["status_samples"] for run in result["runs"])
    assert out.with_name("bench_throughput.png").stat().st_size > 0
    time.sleep(1.5)  # the scheduler writes its status every second
    # The second level sent fresh words: it found nothing of the first's in the prefix cache.
    assert prefix_cache_hits(running.redis_url, running.namespace) == 0
    assert out.with_name("bench_latency_cdf.png").stat().st_size > 0


def test_bench_sends_chat_requests_about_prose(pipeline, tmp_path: Path) -> None:
    """`--text prose`: prompts rendered with the served model's chat template, of the asked
    lengths, served with exact output lengths at every level."""
    running, model_dir = pipeline
    out = tmp_path / "prose"
    code = main([
        "bench", "--base-url", running.base_url, "--model", str(model_dir), "--text", "prose",
        "--num-prompts", "4", "--prompt-len", "90", "--prompt-len-sigma", "0.3",
        "--prompt-len-range", "70,150", "--output-len", "5", "--output-len-range", "2,8",
        "--seed", "5", "--concurrency-sweep", "1,2", "--num-warmups", "1", "--out", str(out),
        "--no-plots",
    ])  # fmt: skip
    assert code == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["workload"]["text"] == "prose"
    assert 69 <= result["workload"]["prompt_len"]["min"] <= result["workload"]["prompt_len"]["max"]
    assert result["workload"]["prompt_len"]["max"] <= 151
    for run in result["runs"]:
        assert run["num_completed"] == 4 and run["num_failed"] == 0
        assert run["num_wrong_length"] == 0
    # The server reads each prompt as the workload counted it: the template's tokens included.
    import argparse

    import httpx

    from pagedserve.services.cli.loadgen.runner import build_workload

    args = argparse.Namespace(
        model=str(model_dir), tokenizer=None, dataset=None, num_prompts=4, seed=5,
        prompt_len=90, prompt_len_sigma=0.3, prompt_len_range=[70, 150], output_len=5,
        output_len_sigma=0.6, output_len_range=[2, 8], text="prose",
    )  # fmt: skip
    requests, _, _ = build_workload(args)
    for request in requests:
        assert request.prompt.startswith("<|im_start|>user\n")
        answer = httpx.post(
            f"{running.base_url}/tokenize", json={"model": str(model_dir), "prompt": request.prompt}
        ).json()
        assert answer["tokens"] == request.prompt_token_ids


def test_bench_refuses_an_unknown_model_name(pipeline, tmp_path: Path) -> None:
    running, model_dir = pipeline
    out = tmp_path / "bad"
    code = main([
        "bench", "--base-url", running.base_url, "--model", "no-such-model",
        "--tokenizer", str(model_dir), "--num-prompts", "2", "--prompt-len", "8",
        "--prompt-len-range", "4,16", "--output-len", "3", "--output-len-range", "2,4",
        "--out", str(out), "--no-plots",
    ])  # fmt: skip
    assert code == 1  # requests failed, and the JSON says why
    result = json.loads(out.with_suffix(".json").read_text())
    [run] = result["runs"]
    assert run["num_failed"] == 2
    assert any("no-such-model" in e for e in run["errors"])


def test_every_request_kind_of_the_soak_is_served_and_the_engine_ends_idle(
    pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`benchmarks/soak.py`'s mix against the real pipeline: each kind once (the bad request
    refused with a 4xx, every other served), then the engine idle with no KV block held."""
    import asyncio
    import random

    import httpx

    from benchmarks import soak
    from benchmarks.soak import KINDS, idle_state, one_request

    running, _ = pipeline
    monkeypatch.setattr(soak, "words", lambda rng, low, high: "the river")  # the tiny model's

    async def each_kind() -> dict[str, str]:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=120) as client:
            rng = random.Random(0)
            return {kind: await one_request(client, kind, rng) for kind in sorted(KINDS)}

    outcomes = asyncio.run(each_kind())
    expected = {kind: "4xx" if kind == "bad request" else "2xx" for kind in KINDS}
    assert outcomes == expected
    assert idle_state(running.base_url) == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
