"""`pagedserve bench`: an asyncio load generator against any OpenAI-compatible server.

Sends a workload (synthetic lognormal lengths or a JSONL file) as streaming requests, either
as a Poisson process at `--request-rate` (inf: all at once) or with at most
`--max-concurrency` in flight, or once per level of `--concurrency-sweep`. Reports throughput
and TTFT / TPOT / ITL / E2E distributions, writes JSON and PNG plots, and can run the
Hugging Face `generate` baseline on the same workload in the same run (`--hf-baseline`).

Fair to the prefix cache: every level after the first sends the same requests with fresh
random words (same prompt and output lengths, so the same model work), since the server would
otherwise find every prompt of the earlier levels in its prefix cache and skip their prefills,
which the HF baseline (run on the first level's requests) computes. A JSONL workload's content
cannot be regenerated: its later levels repeat the prompts and say so (`fresh_prompts: false`
in the run's JSON). Before the first level, `--num-warmups` requests of fresh words (not
measured) take the server's cold start.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from pagedserve.services.cli.loadgen.engine_time import (
    engine_time_shares,
    format_shares,
    read_engine_seconds,
)
from pagedserve.services.cli.loadgen.latency_stats import RequestRecord, summarize
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig, send_request
from pagedserve.services.cli.loadgen.status_sampler import StatusSampler
from pagedserve.services.cli.loadgen.workload import (
    BenchRequest,
    poisson_arrival_times,
    with_fresh_words,
)

REPEATED_PROMPTS_NOTE = (
    "same prompts as an earlier level (a JSONL workload cannot be regenerated): they may hit "
    "the server's prefix cache"
)


@dataclass(frozen=True)
class LoadConfig:
    request_rate: float = math.inf  # Poisson arrivals per second; inf: all at once
    max_concurrency: int | None = None  # None: unbounded
    seed: int = 0
    timeout_s: float = 600.0  # per request

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.request_rate <= 0:
            raise ValueError(
                f"request_rate must be > 0 (inf: all at once), got {self.request_rate}"
            )


async def _send_at(
    endpoint: EndpointConfig,
    request: BenchRequest,
    send_time: float,
    gate: asyncio.Semaphore | None,
    timeout_s: float,
) -> RequestRecord:
    delay = send_time - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    if gate is None:
        return await send_request(endpoint, request, timeout_s)
    async with gate:
        return await send_request(endpoint, request, timeout_s)


async def run_load(
    endpoint: EndpointConfig,
    requests: list[BenchRequest],
    load: LoadConfig,
    sampler: StatusSampler | None = None,
) -> dict[str, Any]:
    """Send every request; the run's summary, its per-request records and status samples."""
    gate = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    offsets = poisson_arrival_times(len(requests), load.request_rate, load.seed)
    start = time.perf_counter()
    if sampler is not None:
        sampler.samples.clear()
        sampler.start(start)
    tasks = [
        _send_at(endpoint, request, start + offset, gate, load.timeout_s)
        for request, offset in zip(requests, offsets, strict=True)
    ]
    records = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    samples = await sampler.stop() if sampler is not None else []
    summary = summarize(records, duration)
    summary["max_concurrency"] = load.max_concurrency
    summary["request_rate"] = load.request_rate if math.isfinite(load.request_rate) else "inf"
    summary["status_samples"] = [asdict(s) for s in samples]
    summary["records"] = [_record_json(r) for r in records]
    return summary


def _record_json(record: RequestRecord) -> dict[str, Any]:
    return {
        "prompt_len": record.prompt_len,
        "output_len": record.num_output_tokens,
        "ttft_s": record.ttft,
        "tpot_s": record.tpot,
        "e2e_s": record.e2e,
        "error": record.error,
    }


async def wait_until_ready(endpoint: EndpointConfig, timeout_s: float = 120.0) -> None:
    """Poll `/health` (falling back to `/v1/models`) until the server answers 200."""
    root = endpoint.root
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() < deadline:
            for path in ("/health", "/v1/models"):
                try:
                    response = await client.get(root + path, headers=endpoint.headers)
                    if response.status_code == 200:
                        return
                    last = f"{path}: HTTP {response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    last = f"{path}: {exc}"
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{root} was not ready within {timeout_s}s ({last})")


@dataclass(frozen=True)
class Level:
    """One load level and the requests it sends. `fresh_prompts`: no earlier level or warm-up
    of this bench sent these prompts, so they can hit no prefix it left in the server's cache."""

    load: LoadConfig
    requests: list[BenchRequest]
    fresh_prompts: bool


def plan_levels(
    requests: list[BenchRequest],
    tokenizer: Any,
    loads: list[LoadConfig],
    seed: int,
    synthetic: bool,
) -> list[Level]:
    """Level 0 sends `requests`; level i > 0 sends them with fresh words (seed `seed + i`) when
    the workload is synthetic, else the same prompts again."""
    levels = []
    for i, load in enumerate(loads):
        if i == 0:
            levels.append(Level(load, requests, fresh_prompts=True))
        elif synthetic:
            levels.append(Level(load, with_fresh_words(requests, tokenizer, seed + i), True))
        else:
            levels.append(Level(load, requests, fresh_prompts=False))
    return levels


def warmup_requests(
    requests: list[BenchRequest], tokenizer: Any, num_warmups: int, seed: int
) -> list[BenchRequest]:
    """`num_warmups` requests shaped like the workload's first ones (cycling through it), with
    fresh words: `seed` must differ from every level's, so that the warm-up fills the prefix
    cache with nothing a measured level sends."""
    if num_warmups < 0:
        raise ValueError(f"num_warmups must be >= 0, got {num_warmups}")
    shapes = [requests[i % len(requests)] for i in range(num_warmups)]
    return with_fresh_words(shapes, tokenizer, seed)


def warm_up(endpoint: EndpointConfig, requests: list[BenchRequest]) -> dict[str, Any]:
    """Send the warm-up requests all at once, unmeasured, so that the first level does not pay
    the server's cold start (first-touch allocations, lazy initialisation)."""
    if not requests:
        return {"num_requests": 0, "num_failed": 0}
    records = asyncio.run(run_load(endpoint, requests, LoadConfig()))["records"]
    num_failed = sum(1 for r in records if r["error"])
    print(f"warm-up: {len(requests)} requests, {num_failed} failed", flush=True)
    return {"num_requests": len(requests), "num_failed": num_failed}


def run_levels(
    endpoint: EndpointConfig, levels: list[Level], sampler: StatusSampler | None = None
) -> list[dict[str, Any]]:
    """One run per load level, in order, printing a line after each. Against pagedserve each
    summary also says how busy the engine kept its model (`engine_time.py`)."""
    runs = []
    for level in levels:
        if not level.fresh_prompts:
            print(f"note: {REPEATED_PROMPTS_NOTE}", flush=True)
        before = read_engine_seconds(endpoint)
        summary = asyncio.run(run_load(endpoint, level.requests, level.load, sampler))
        after = read_engine_seconds(endpoint)
        summary["engine_time"] = engine_time_shares(before, after, summary["duration_s"])
        summary["fresh_prompts"] = level.fresh_prompts
        if not level.fresh_prompts:
            summary["prefix_cache_note"] = REPEATED_PROMPTS_NOTE
        print(format_summary_line(summary), flush=True)
        runs.append(summary)
    return runs


def format_summary_line(summary: dict[str, Any]) -> str:
    def ms(name: str, key: str) -> str:
        value = summary[name][key]
        return "-" if value is None else f"{value:.0f}"

    return (
        f"concurrency={summary['max_concurrency'] or 'inf'} rate={summary['request_rate']}: "
        f"{summary['num_completed']}/{summary['num_requests']} ok, "
        f"{summary['request_throughput']:.2f} req/s, {summary['output_throughput']:.1f} out tok/s, "
        f"TTFT p50 {ms('ttft_ms', 'p50')} ms p99 {ms('ttft_ms', 'p99')} ms, "
        f"TPOT p50 {ms('tpot_ms', 'p50')} ms, ITL p50 {ms('itl_ms', 'p50')} ms, "
        f"E2E p50 {ms('e2e_ms', 'p50')} ms{format_shares(summary.get('engine_time'))}"
    )


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


class BenchError(RuntimeError):
    """A benchmark that cannot start: bad workload, unreachable server, unknown model."""


def build_workload(args: Any) -> tuple[list[BenchRequest], Any, Path]:
    """The requests, the tokenizer that measured them and the model directory."""
    from transformers import AutoTokenizer

    from pagedserve.services.cli.loadgen.workload import (
        LengthDistribution,
        load_jsonl_workload,
        synthetic_workload,
    )
    from pagedserve.services.gpu_worker.default_model import ensure_model

    name = args.tokenizer or args.model
    try:
        model_dir = ensure_model(name)
    except FileNotFoundError as exc:
        raise BenchError(f"{exc} (pass --tokenizer DIR for a server's model)") from exc
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    try:
        if args.dataset:
            requests = load_jsonl_workload(Path(args.dataset), tokenizer, args.num_prompts)
            return requests, tokenizer, model_dir
        prompt_lens = LengthDistribution(args.prompt_len, args.prompt_len_sigma,
                                         *args.prompt_len_range)  # fmt: skip
        output_lens = LengthDistribution(args.output_len, args.output_len_sigma,
                                         *args.output_len_range)  # fmt: skip
        requests = synthetic_workload(tokenizer, args.num_prompts, prompt_lens, output_lens,
                                      args.seed, getattr(args, "text", "words"))  # fmt: skip
    except (ValueError, TypeError, OSError) as exc:
        raise BenchError(f"bad workload: {exc}") from exc
    return requests, tokenizer, model_dir


def workload_summary(requests: list[BenchRequest]) -> dict[str, Any]:
    prompt = [r.prompt_len for r in requests]
    output = [r.output_len for r in requests]
    return {
        "num_requests": len(requests),
        "prompt_len": {"min": min(prompt), "mean": sum(prompt) / len(prompt), "max": max(prompt)},
        "output_len": {"min": min(output), "mean": sum(output) / len(output), "max": max(output)},
        "total_output_tokens": sum(output),
        "text": ",".join(sorted({r.text for r in requests})),  # what the prompts hold
    }


def load_levels(args: Any) -> list[LoadConfig]:
    if args.concurrency_sweep:
        return [LoadConfig(args.request_rate, c, args.seed) for c in args.concurrency_sweep]
    return [LoadConfig(args.request_rate, args.max_concurrency, args.seed)]


def run_hf(args: Any, requests: list[BenchRequest], model_dir: Path) -> dict[str, Any]:
    import torch

    from pagedserve.services.cli.loadgen.hf_baseline import run_hf_baseline
    from pagedserve.services.gpu_worker.default_model import ensure_model
    from pagedserve.services.gpu_worker.platforms import resolve_dtype

    hf_dir = ensure_model(args.hf_model) if args.hf_model else model_dir
    device = getattr(args, "hf_device", "cpu")
    dtype = resolve_dtype(args.hf_dtype, torch.device(device))
    return run_hf_baseline(
        hf_dir, requests, dtype, args.hf_batch_sizes, threads=args.hf_threads, device=device
    )


def run_from_args(args: Any) -> int:
    """The whole `pagedserve bench` run; exit code 1 when any request failed. With `--launch`,
    the pipeline is started here for `--model` (logs in a temporary file) and stopped before
    the HF baseline runs, so that the baseline has the machine to itself. The baseline runs
    the first level's requests (it has no prefix cache, so repeats would cost it the same)."""
    requests, tokenizer, model_dir = build_workload(args)
    loads = load_levels(args)
    levels = plan_levels(requests, tokenizer, loads, args.seed, synthetic=not args.dataset)
    # Level i > 0 uses seed + i: the warm-up takes the next seed, used by no level.
    warmup = warmup_requests(requests, tokenizer, args.num_warmups, args.seed + len(loads))
    if args.launch:
        result = _bench_launched(args, levels, warmup, model_dir)
    else:
        result = bench_server(args, levels, warmup)
    if args.hf_baseline:
        best = max(result["runs"], key=lambda r: r["output_throughput"])
        result["hf_baseline"] = hf = run_hf(args, requests, model_dir)
        result["speedup_vs_hf"] = best["output_throughput"] / hf["output_throughput"]
        print(f"best server run / HF generate: {result['speedup_vs_hf']:.2f}x output tok/s")
    out = Path(args.out)
    write_json(result, out.with_suffix(".json"))
    if not args.no_plots:
        from pagedserve.services.cli.loadgen.plots import write_plots

        for path in write_plots(result, out):
            print(f"wrote {path}")
    print(f"wrote {out.with_suffix('.json')}")
    return 1 if any(r["num_failed"] for r in result["runs"]) else 0


def _bench_launched(
    args: Any, levels: list[Level], warmup: list[BenchRequest], model_dir: Path
) -> dict[str, Any]:
    import tempfile

    from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig

    config = PipelineConfig(
        model_dir, args.dtype, args.max_num_seqs, worker_threads=args.worker_threads
    )
    log_path = Path(tempfile.gettempdir()) / "pagedserve-bench-launch.log"
    print(f"starting the pipeline for {model_dir} (logs: {log_path})", flush=True)
    with log_path.open("w") as log, LocalPipeline(config, log=log) as pipeline:
        args.base_url, args.redis_url, args.namespace = (
            pipeline.base_url, pipeline.redis_url, pipeline.namespace,
        )  # fmt: skip
        args.model = str(model_dir)
        return bench_server(args, levels, warmup)


def bench_server(args: Any, levels: list[Level], warmup: list[BenchRequest]) -> dict[str, Any]:
    """The warm-up, then every load level, against the server at `args.base_url`."""
    endpoint = EndpointConfig(args.base_url, args.model, args.endpoint, args.api_key,
                              ignore_eos=not args.no_ignore_eos)  # fmt: skip
    try:
        asyncio.run(wait_until_ready(endpoint, args.ready_timeout))
    except TimeoutError as exc:
        raise BenchError(str(exc)) from exc
    sampler = None
    if args.redis_url or args.metrics_url:
        sampler = StatusSampler(args.redis_url, args.namespace, args.metrics_url)
    warmup_summary = warm_up(endpoint, warmup)
    return {
        "label": args.label,
        "base_url": args.base_url,
        "model": args.model,
        "endpoint": args.endpoint,
        "seed": args.seed,
        "workload": workload_summary(levels[0].requests),
        "warmup": warmup_summary,
        "runs": run_levels(endpoint, levels, sampler),
    }
