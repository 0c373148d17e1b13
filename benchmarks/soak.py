"""A long run of mixed requests through the whole pipeline, watching for what grows: each
process's resident memory, Redis's memory and key count, KV blocks held once idle.

The mix is what a deployment sees over a day, in small: streamed and plain completions and
chats, several choices with seeds, logprobs and prompt logprobs, echo, JSON-schema outputs,
forced tool calls, beam search, stop strings, clients that hang up mid-stream, bad requests
(4xx) and /tokenize, from `--concurrency` clients at once. Every `--sample-every` seconds it
reads each process's RSS (/proc) and Redis's `used_memory` and key count. At the end the load
stops; once the engine is idle the report gives each process's RSS after warm-up (the first
sample past `--warmup-fraction` of the run) and at the end, the growth per 1000 requests,
Redis's keys and memory, the KV cache usage and the requests still running (both must be 0),
and every 5xx or transport error (there must be none).

    python -m benchmarks.soak --minutes 20 --out benchmarks/results/soak
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.machine_info import machine_info
from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig
from pagedserve.services.cli.loadgen.runner import write_json
from pagedserve.services.gpu_worker.default_model import ensure_model

WORDS = ["the", "a", "river", "stone", "city", "light", "house", "green", "quiet", "seven"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
TOOL = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def chat(rng: random.Random, **extra: Any) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": words(rng, 3, 40)}]
    return "/v1/chat/completions", {"messages": messages, **extra}


def completion(rng: random.Random, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"prompt": words(rng, 2, 120), **extra}


# kind -> a request of that kind (path, body); "hang up" streams and closes after 3 chunks
KINDS = {
    "stream completion": lambda r: completion(r, max_tokens=r.randint(4, 64), stream=True,
                                              stream_options={"include_usage": True}),
    "chat": lambda r: chat(r, max_tokens=r.randint(4, 48), temperature=0.7, seed=r.randint(0, 9)),
    "stream chat": lambda r: chat(r, max_tokens=r.randint(4, 48), stream=True),
    "n=3 with seed": lambda r: completion(r, max_tokens=12, n=3, temperature=0.9, seed=7),
    "logprobs": lambda r: chat(r, max_tokens=8, logprobs=True, top_logprobs=3),
    "echo + logprobs": lambda r: completion(r, max_tokens=1, echo=True, logprobs=2),
    "prompt_logprobs": lambda r: completion(r, max_tokens=4, prompt_logprobs=2),
    "json schema": lambda r: chat(r, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}),
    "forced tool call": lambda r: chat(r, max_tokens=40, tools=[TOOL], tool_choice="required"),
    "beam search": lambda r: completion(r, max_tokens=8, use_beam_search=True, n=2),
    "stop + min_tokens": lambda r: completion(r, max_tokens=24, stop=[" the", "."], min_tokens=2),
    "hang up": lambda r: completion(r, max_tokens=200, stream=True, temperature=0),
    "bad request": lambda r: completion(r, temperature=-1),
    "tokenize": lambda r: ("/tokenize", {"prompt": words(r, 1, 30)}),
}  # fmt: skip


async def one_request(client: httpx.AsyncClient, kind: str, rng: random.Random) -> str:
    """The request's outcome: its status class, or what went wrong."""
    path, body = KINDS[kind](rng)
    try:
        if body.get("stream"):
            async with client.stream("POST", path, json=body) as answer:
                chunks = 0
                async for _ in answer.aiter_lines():
                    chunks += 1
                    if kind == "hang up" and chunks >= 3:
                        break  # the client goes away: the engine must drop the request
                return f"{answer.status_code // 100}xx"
        answer = await client.post(path, json=body)
        return f"{answer.status_code // 100}xx"
    except httpx.HTTPError as exc:
        return f"transport error: {type(exc).__name__}"


async def drive(base_url: str, seconds: float, concurrency: int, seed: int) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    kinds = sorted(KINDS)

    async def client_loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
            while time.monotonic() < deadline:
                kind = rng.choice(kinds)
                outcomes[f"{kind}: {await one_request(client, kind, rng)}"] += 1

    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
    return outcomes


def rss_mib(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match[1]) / 1024 if match else None


def sample(pids: dict[str, int], store: redis.Redis, start: float) -> dict[str, Any]:
    info = store.info("memory")
    return {
        "t_s": round(time.monotonic() - start, 1),
        "rss_mib": {name: rss_mib(pid) for name, pid in pids.items()},
        "redis_used_mib": info["used_memory"] / 2**20,
        "redis_keys": store.dbsize(),
    }


def metric(text: str, name: str) -> float:
    """The sum of a family's samples in Prometheus text (0 if absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def idle_state(base_url: str, timeout_s: float = 120.0) -> dict[str, float]:
    """The engine's running / waiting requests and KV usage, once nothing runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(base_url + "/metrics", timeout=10).text
        state = {
            "running": metric(text, "vllm:num_requests_running"),
            "waiting": metric(text, "vllm:num_requests_waiting"),
            "kv_cache_usage": metric(text, "vllm:kv_cache_usage_perc"),
        }
        if state["running"] == state["waiting"] == 0 or time.monotonic() > deadline:
            return state
        time.sleep(1.0)


def growth(samples: list[dict[str, Any]], warm_index: int, num_requests: int) -> dict[str, Any]:
    """Per process: RSS after warm-up, at the end, and the growth per 1000 requests; a
    process that was gone at a sample since warm-up (no /proc entry) is reported as died."""
    out: dict[str, Any] = {}
    for name in samples[0]["rss_mib"]:
        if any(s["rss_mib"][name] is None for s in samples[warm_index:]):
            out[name] = {"died": True}
            continue
        warm = samples[warm_index]["rss_mib"][name]
        end = statistics.median(s["rss_mib"][name] for s in samples[-3:])
        out[name] = {
            "warm_mib": round(warm, 1),
            "end_mib": round(end, 1),
            "growth_mib": round(end - warm, 1),
            "per_1000_requests_mib": round(1000 * (end - warm) / max(num_requests, 1), 2),
        }
    return out


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        f"# Soak: {result['minutes']} min, {result['num_requests']} requests from "
        f"{result['concurrency']} clients",
        "",
        "| process | RSS after warm-up MiB | at the end MiB | growth MiB | per 1000 requests |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, g in result["rss"].items():
        if g.get("died"):
            lines.append(f"| {name} | died during the run | | | |")
            continue
        lines.append(f"| {name} | {g['warm_mib']} | {g['end_mib']} | {g['growth_mib']} | "
                     f"{g['per_1000_requests_mib']} |")  # fmt: skip
    first, last = result["samples"][result["warm_index"]], result["samples"][-1]
    lines += [
        "",
        f"Redis: {first['redis_keys']} keys / {first['redis_used_mib']:.1f} MiB after warm-up, "
        f"{last['redis_keys']} / {last['redis_used_mib']:.1f} at the end; once idle "
        f"{result['idle_redis_keys']} keys.",
        f"Once idle: {result['idle']}.",
        f"Failures (5xx, transport errors): {result['failures'] or 'none'}.",
        "",
        "| request kind: outcome | count |",
        "|---|---:|",
        *(f"| {k} | {v} |" for k, v in sorted(result["outcomes"].items())),
    ]
    return lines


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = PipelineConfig(ensure_model(args.model), args.dtype, max_model_len=1024)
    workdir = Path(tempfile.mkdtemp(prefix="pagedserve-soak-"))
    with (workdir / "pipeline.log").open("w") as log, LocalPipeline(config, log=log) as pipeline:
        pids = {c.name: c.pid for c in pipeline.supervisor.children}
        pids["redis"] = pipeline.redis.pid
        store = redis.Redis.from_url(pipeline.redis_url)
        start, samples = time.monotonic(), []
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(asyncio.run, drive(
                pipeline.base_url, 60 * args.minutes, args.concurrency, args.seed))  # fmt: skip
            while not load.done():
                samples.append(sample(pids, store, start))
                wait([load], timeout=args.sample_every)
            outcomes = load.result()
        idle = idle_state(pipeline.base_url)
        time.sleep(args.settle)
        samples.append(sample(pids, store, start))
        idle_keys = store.dbsize()
    num_requests = sum(outcomes.values())
    warm_index = max(0, min(int(len(samples) * args.warmup_fraction), len(samples) - 4))
    failures = {k: v for k, v in outcomes.items() if "5xx" in k or "transport" in k}
    rss = growth(samples, warm_index, num_requests)
    failures |= {f"{name} died": 1 for name, g in rss.items() if g.get("died")}
    return {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "num_requests": num_requests,
        "outcomes": dict(outcomes),
        "failures": failures,
        "rss": rss,
        "warm_index": warm_index,
        "idle": idle,
        "idle_redis_keys": idle_keys,
        "samples": samples,
        "log": str(workdir / "pipeline.log"),
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--sample-every", type=float, default=15.0, help="seconds between samples")
    p.add_argument("--warmup-fraction", type=float, default=0.2)
    p.add_argument("--settle", type=float, default=5.0, help="seconds idle before the last sample")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/soak")
    args = p.parse_args(argv)
    result = run(args)
    write_json(result, Path(args.out + ".json"))
    lines = report_lines(result)
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(result["rss"]))


if __name__ == "__main__":
    main()
