"""What the service hops cost: the same workload through the in-process engine and through
HTTP + Redis + ZeroMQ (gateway, scheduler and worker as separate processes).

Both runs send every request at once with fixed output lengths (`ignore_eos`), so they do
the same model work; the difference in wall time, per engine step and per output token, is
the pipeline: tokenization and SSE in the gateway, Redis streams both ways, msgpack plans and
results over ZeroMQ, and the three processes sharing the machine's cores. The in-process run
also records the KV trace for the KV memory report.

The engine runs the workload twice, before and after the pipeline, and the spread of the two
is the machine's noise over the comparison. Every measured run starts with no workload prompt
in the prefix cache: the engine's cache is reset before each of its runs (else the second one
would skip every prefill), and the warm-ups (`NUM_WARMUP` requests, in-process and through the
pipeline) use fresh words of their own. Each run records its prefix-cache hit tokens.

    python -m benchmarks.pipeline_overhead --num-prompts 64 --out benchmarks/results/pipeline
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.kv_memory import build_engine, format_report, kv_report, run_engine
from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig
from pagedserve.services.cli.loadgen.runner import LoadConfig, run_load, warmup_requests
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.status_sampler import StatusSampler
from pagedserve.services.cli.loadgen.workload import (
    BenchRequest,
    LengthDistribution,
    synthetic_workload,
)
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import EngineStatus, from_fields

NUM_WARMUP = 4


def in_process_run(engine: Any, requests: list[BenchRequest]) -> dict[str, Any]:
    """One measured run of the workload on a prefix cache reset first, as a fresh server's."""
    engine.reset_prefix_cache()
    hits_before = engine.scheduler.stats().prefix_cache_hits
    run = run_engine(engine, requests)
    scheduler = engine.scheduler
    report = kv_report(run.trace, scheduler.block_size, scheduler.num_blocks,
                       scheduler.config.max_model_len)  # fmt: skip
    return {
        "duration_s": run.duration_s,
        "num_steps": run.num_steps,
        "num_output_tokens": run.num_output_tokens,
        "num_failed": run.num_failed,
        "output_throughput": run.num_output_tokens / run.duration_s,
        "step_ms": 1000 * run.duration_s / run.num_steps,
        "max_batch_size": max(run.batch_sizes),
        "prefix_cache_hit_tokens": scheduler.stats().prefix_cache_hits - hits_before,
        "kv_memory": report,
    }


def mean_of_runs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The two in-process runs (before and after the pipeline's) as one, with their spread:
    the machine's noise over the time of the comparison."""
    duration = (first["duration_s"] + second["duration_s"]) / 2
    num_steps = (first["num_steps"] + second["num_steps"]) / 2
    return {
        **first,
        "duration_s": duration,
        "num_steps": num_steps,
        "output_throughput": first["num_output_tokens"] / duration,
        "step_ms": 1000 * duration / num_steps,
        "runs_output_throughput": [first["output_throughput"], second["output_throughput"]],
        # Over both runs. Random-word prompts share no prefix: hits come only from a preempted
        # request finding its own blocks again, or from a cache the reset missed.
        "prefix_cache_hit_tokens": first["prefix_cache_hit_tokens"]
        + second["prefix_cache_hit_tokens"],
        "noise": abs(first["duration_s"] - second["duration_s"]) / duration,
    }


def _engine_totals(redis_url: str, namespace: str) -> tuple[int, int]:
    """Engine steps and prefix-cache hit tokens so far, over every engine's status."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = RedisKeys(namespace)
        num_steps = num_hits = 0
        for engine_id in client.smembers(keys.engines):
            fields = client.hgetall(keys.engine(engine_id.decode()))
            if fields:
                status = from_fields(EngineStatus, fields)
                num_steps += status.num_steps
                num_hits += status.prefix_cache_hits
        return num_steps, num_hits
    finally:
        client.close()


def through_pipeline(
    config: PipelineConfig,
    requests: list[BenchRequest],
    warmup: list[BenchRequest],
    model_name: str,
) -> dict[str, Any]:
    log_path = Path(tempfile.gettempdir()) / "pagedserve-bench-pipeline.log"
    with log_path.open("w") as log, LocalPipeline(config, log=log) as p:
        endpoint = EndpointConfig(p.base_url, model_name)
        asyncio.run(run_load(endpoint, warmup, LoadConfig()))
        time.sleep(1.5)  # the scheduler writes its status every second
        steps_before, hits_before = _engine_totals(p.redis_url, p.namespace)
        sampler = StatusSampler(p.redis_url, p.namespace)
        summary = asyncio.run(run_load(endpoint, requests, LoadConfig(), sampler))
        time.sleep(1.5)
        steps_after, hits_after = _engine_totals(p.redis_url, p.namespace)
    summary["num_steps"] = num_steps = steps_after - steps_before
    summary["step_ms"] = 1000 * summary["duration_s"] / max(num_steps, 1)
    summary["prefix_cache_hit_tokens"] = hits_after - hits_before
    return summary


def compare(inproc: dict[str, Any], pipe: dict[str, Any]) -> dict[str, Any]:
    tokens = inproc["num_output_tokens"]
    return {
        "throughput_loss": 1 - pipe["output_throughput"] / inproc["output_throughput"],
        "extra_ms_per_step": pipe["step_ms"] - inproc["step_ms"],
        "extra_ms_per_token": 1000 * (pipe["duration_s"] - inproc["duration_s"]) / tokens,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pipeline_overhead", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--prompt-len-sigma", type=float, default=0.6)
    p.add_argument("--output-len-sigma", type=float, default=0.6)
    p.add_argument("--prompt-len-max", type=int, default=1024)
    p.add_argument("--output-len-max", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="in-process torch threads")
    p.add_argument("--worker-threads", type=int, default=None, help="the worker's OMP threads")
    p.add_argument("--out", default="benchmarks/results/pipeline_overhead")
    return p


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    from pagedserve.services.gpu_worker.default_model import ensure_model

    args = build_parser().parse_args(argv)
    model_dir = ensure_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    requests = synthetic_workload(
        tokenizer,
        args.num_prompts,
        LengthDistribution(args.prompt_len, args.prompt_len_sigma, 8, args.prompt_len_max),
        LengthDistribution(args.output_len, args.output_len_sigma, 4, args.output_len_max),
        args.seed,
    )
    # Shaped like the first requests, with words of their own: no measured prompt is cached.
    warmup = warmup_requests(requests, tokenizer, NUM_WARMUP, args.seed + 1)
    engine = build_engine(str(model_dir), args.max_num_seqs, None, args.dtype, args.threads)
    run_engine(engine, warmup, trace=False)
    before = in_process_run(engine, requests)
    print(f"in-process: {before['output_throughput']:.1f} out tok/s, "
          f"{before['num_steps']} steps, {before['step_ms']:.1f} ms/step, "
          f"{before['prefix_cache_hit_tokens']} prefix-cache hit tokens")  # fmt: skip
    print(format_report(before["kv_memory"]))
    config = PipelineConfig(
        model_dir, args.dtype, args.max_num_seqs, worker_threads=args.worker_threads
    )
    pipe = through_pipeline(config, requests, warmup, str(model_dir))
    after = in_process_run(engine, requests)
    inproc = mean_of_runs(before, after)
    print(f"in-process again: {after['output_throughput']:.1f} out tok/s, "
          f"{after['prefix_cache_hit_tokens']} prefix-cache hit tokens "
          f"(spread between the two: {100 * inproc['noise']:.1f}%)")  # fmt: skip
    print(f"pipeline:   {pipe['output_throughput']:.1f} out tok/s, "
          f"{pipe['num_steps']} steps, {pipe['step_ms']:.1f} ms/step, "
          f"{pipe['prefix_cache_hit_tokens']} prefix-cache hit tokens, "
          f"{pipe['num_failed']} failed")  # fmt: skip
    result = {
        "threads": args.threads,
        "worker_threads": args.worker_threads,
        "in_process": inproc,
        "pipeline": pipe,
        "overhead": compare(inproc, pipe),
    }
    o = result["overhead"]
    print(
        f"pipeline hops: {100 * o['throughput_loss']:.1f}% of throughput, "
        f"{o['extra_ms_per_step']:+.1f} ms/step, {o['extra_ms_per_token']:+.2f} ms/token"
    )
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
