"""Routing policies compared on one cluster: two engines (one scheduler + one single-threaded
CPU worker each) on one Redis, and one gateway per policy (`--routing cache|load|shared`).

    python -m benchmarks.routing --out benchmarks/results/routing.json

Workloads, each request non-streaming at temperature 0 with `ignore_eos`:
- `tenants`: 8 tenants, each with its own shared prefix of 1024-2048 random token ids, and
  64 requests spread evenly among them in random order, each the tenant's prefix plus 32
  tokens of its own;
- `unique`: 64 requests with no shared prefix (256-512 random token ids each).
Each round draws a workload's shape once (tenant order, prefix and prompt lengths) and every
policy runs that shape with fresh token ids, so all see the same amount of work and no run
finds another's blocks. Runs are alternated: the policy order rotates from round to round, and
a policy's figure is its median round. `prefix_hit_tokens` sums the requests' own
`usage.prompt_tokens_details.cached_tokens`; `output_tok_per_s` is completion tokens over the
wall time from the first request sent to the last answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.machine_info import cpu_ticks, machine_info, steal_share
from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import RedisServer
from pagedserve.services.cli.supervisor import ChildSpec, Supervisor
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.options import option_argv
from pagedserve.shared.status import EngineStatus, from_fields

POLICIES = ("cache", "load", "shared")
NUM_ENGINES = 2
SERVED_NAME = "bench"
TOKEN_ID_RANGE = (1000, 30000)  # ordinary BPE pieces of SmolLM2's vocabulary: no specials


@dataclass(frozen=True)
class BenchConfig:
    model: str = "tiny-smollm2"  # SmolLM2-135M prefills ~50 tok/s per thread on the busy box
    num_blocks: int = 1024  # per engine: 8192 tokens at 8 per block
    num_tenants: int = 8
    num_requests: int = 64
    prefix_tokens: tuple[int, int] = (1024, 2048)
    suffix_tokens: int = 32
    unique_tokens: tuple[int, int] = (256, 512)
    max_tokens: int = 32
    concurrency: int = 16
    rounds: int = 2
    seed: int = 0


# -- workloads -------------------------------------------------------------------------------


def random_ids(rng: random.Random, num: int) -> list[int]:
    return [rng.randrange(*TOKEN_ID_RANGE) for _ in range(num)]


def tenant_shape(config: BenchConfig, rng: random.Random) -> list[tuple[int, int]]:
    """Per request: (its tenant, that tenant's prefix length); the tenants in random order."""
    lengths = [rng.randint(*config.prefix_tokens) for _ in range(config.num_tenants)]
    tenants = [i % config.num_tenants for i in range(config.num_requests)]
    rng.shuffle(tenants)
    return [(t, lengths[t]) for t in tenants]


def tenant_prompts(
    config: BenchConfig, shape: list[tuple[int, int]], rng: random.Random
) -> list[list[int]]:
    """The shape's requests with fresh token ids: same lengths, no block of an earlier run."""
    prefixes = {t: random_ids(rng, n) for t, n in set(shape)}
    return [prefixes[t] + random_ids(rng, config.suffix_tokens) for t, _ in shape]


def unique_shape(config: BenchConfig, rng: random.Random) -> list[tuple[int, int]]:
    return [(i, rng.randint(*config.unique_tokens)) for i in range(config.num_requests)]


def unique_prompts(
    config: BenchConfig, shape: list[tuple[int, int]], rng: random.Random
) -> list[list[int]]:
    return [random_ids(rng, n) for _, n in shape]


# workload -> (draw a shape once per round, the prompts of one run of that shape)
WORKLOADS = {"tenants": (tenant_shape, tenant_prompts), "unique": (unique_shape, unique_prompts)}


# -- the cluster -----------------------------------------------------------------------------


class RoutingCluster:
    """Redis, NUM_ENGINES engines and one gateway per policy, on loopback; `with` stops all."""

    def __init__(self, config: BenchConfig, model_dir: Path) -> None:
        self.config = config
        self.model_dir = model_dir
        self.namespace = f"routing-{uuid.uuid4().hex[:8]}"
        self.redis = RedisServer(free_port())
        self.supervisor = Supervisor(out=sys.stderr)
        self.ports = {policy: free_port() for policy in POLICIES}

    def url(self, policy: str) -> str:
        return f"http://127.0.0.1:{self.ports[policy]}"

    def __enter__(self) -> RoutingCluster:
        self.redis.start()
        try:
            for spec in self._specs():
                self.supervisor.start(spec)
            self.supervisor.wait_until("every engine live", self._engines_ready, 600)
            self.supervisor.wait_until("every gateway healthy", self._gateways_ready, 120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.supervisor.stop(list(reversed(self.supervisor.children)), timeout_s=10.0)
        self.redis.stop()

    def _specs(self) -> list[ChildSpec]:
        specs = []
        worker_env = {**os.environ, "PAGEDSERVE_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        for index in range(NUM_ENGINES):
            ports = {"plan_port": free_port(), "result_port": free_port()}
            specs.append(
                ChildSpec(
                    f"scheduler{index}",
                    _python(
                        "pagedserve.services.scheduler",
                        {
                            "redis_url": self.redis.url,
                            "namespace": self.namespace,
                            "engine_id": f"engine{index}",
                            **ports,
                        },
                    ),
                )
            )
            specs.append(
                ChildSpec(
                    f"worker{index}",
                    _python(
                        "pagedserve.services.gpu_worker",
                        {
                            "model": self.model_dir,
                            "device": "cpu",
                            "num_blocks": self.config.num_blocks,
                            **ports,
                        },
                    ),
                    env=worker_env,
                )
            )
        for policy in POLICIES:
            specs.append(
                ChildSpec(
                    f"gateway-{policy}",
                    _python(
                        "pagedserve.services.gateway",
                        {
                            "model": self.model_dir,
                            "redis_url": self.redis.url,
                            "namespace": self.namespace,
                            "port": self.ports[policy],
                            "gateway_id": f"gw-{policy}",
                            "served_model_name": SERVED_NAME,
                            "routing": policy,
                        },
                    ),
                )
            )
        return specs

    def engine_statuses(self) -> list[EngineStatus]:
        keys = RedisKeys(self.namespace)
        with redis.Redis.from_url(self.redis.url) as client:
            records = [client.hgetall(keys.engine(f"engine{i}")) for i in range(NUM_ENGINES)]
        return [from_fields(EngineStatus, r) for r in records if r]

    def _engines_ready(self) -> bool:
        statuses = self.engine_statuses()
        return len(statuses) == NUM_ENGINES and all(
            s.workers_alive and s.block_size > 0 for s in statuses
        )

    def _gateways_ready(self) -> bool:
        try:
            return all(
                httpx.get(self.url(p) + "/health", timeout=2).status_code == 200 for p in POLICIES
            )
        except httpx.HTTPError:
            return False

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Every engine reports nothing running or waiting (status refreshed each second)."""
        deadline = time.monotonic() + timeout_s
        time.sleep(1.5)
        while time.monotonic() < deadline:
            if all(s.num_running == s.num_waiting == 0 for s in self.engine_statuses()):
                return
            time.sleep(0.5)
        raise TimeoutError(f"engines still busy after {timeout_s:g}s")

    def routing_decisions(self, policy: str) -> dict[str, float]:
        """The policy's gateway's decision counters, `engine/reason` -> count."""
        text = httpx.get(self.url(policy) + "/metrics", timeout=10).text
        counts = {}
        for line in text.splitlines():
            if line.startswith("pagedserve:routing_decisions_total{"):
                labels, value = line[len("pagedserve:routing_decisions_total{") :].split("} ")
                fields = {k: v.strip('"') for k, v in (p.split("=") for p in labels.split(","))}
                counts[fields["engine"] + "/" + fields["reason"]] = float(value)
        return counts


def _python(module: str, values: dict[str, object]) -> list[str]:
    return [sys.executable, "-P", "-m", module, *option_argv(values)]


# -- one run ---------------------------------------------------------------------------------


async def send_all(
    base_url: str, prompts: list[list[int]], max_tokens: int, concurrency: int
) -> dict[str, Any]:
    """Every prompt through `concurrency` clients, in order; the totals of their usage."""
    pending = list(enumerate(prompts))
    usages: list[dict] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while pending:
            _, prompt = pending.pop(0)
            body = {
                "model": SERVED_NAME,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            answer = await client.post(f"{base_url}/v1/completions", json=body)
            answer.raise_for_status()
            usages.append(answer.json()["usage"])

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    wall_s = time.monotonic() - started
    output_tokens = sum(u["completion_tokens"] for u in usages)
    return {
        "prefix_hit_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages),
        "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
        "output_tokens": output_tokens,
        "wall_s": round(wall_s, 3),
        "output_tok_per_s": round(output_tokens / wall_s, 3),
    }


def run_policy(cluster: RoutingCluster, policy: str, prompts: list[list[int]]) -> dict[str, Any]:
    config = cluster.config
    before = cluster.routing_decisions(policy)
    result = asyncio.run(
        send_all(cluster.url(policy), prompts, config.max_tokens, config.concurrency)
    )
    after = cluster.routing_decisions(policy)
    result["decisions"] = {
        k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)
    }
    cluster.wait_idle()
    return result


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per policy: the median round's hit tokens and throughput, and every round."""
    return {
        policy: {
            "prefix_hit_tokens": statistics.median(r["prefix_hit_tokens"] for r in rounds),
            "prefix_hit_fraction": round(
                statistics.median(r["prefix_hit_tokens"] / r["prompt_tokens"] for r in rounds), 4
            ),
            "output_tok_per_s": round(statistics.median(r["output_tok_per_s"] for r in rounds), 3),
            "rounds": rounds,
        }
        for policy, rounds in runs.items()
    }


def ratios(policies: dict[str, Any]) -> dict[str, Any]:
    """Cache routing over the shared stream (hits: None where the shared stream had none):
    of the medians, and round by round (each round runs both on the same shape, back to
    back, so its ratio is the figure least moved by the machine's load)."""
    shared = policies["shared"]
    cache = policies["cache"]
    hits = shared["prefix_hit_tokens"]
    by_round = [
        round(c["output_tok_per_s"] / s["output_tok_per_s"], 3)
        for c, s in zip(cache["rounds"], shared["rounds"], strict=True)
    ]
    return {
        "cache_vs_shared_output_tok_per_s_by_round": by_round,
        "cache_vs_shared_prefix_hit_tokens": (
            round(cache["prefix_hit_tokens"] / hits, 3) if hits else None
        ),
        "cache_vs_shared_output_tok_per_s": round(
            cache["output_tok_per_s"] / shared["output_tok_per_s"], 3
        ),
    }


def run(config: BenchConfig, model_dir: Path) -> dict[str, Any]:
    rng = random.Random(config.seed)
    runs: dict[str, dict[str, list]] = {w: {p: [] for p in POLICIES} for w in WORKLOADS}
    ticks = cpu_ticks()
    with RoutingCluster(config, model_dir) as cluster:
        warm = [random_ids(rng, 64) for _ in range(4)]
        for policy in POLICIES:  # each gateway's first requests, and the engines' first steps
            asyncio.run(send_all(cluster.url(policy), warm, 4, 4))
        cluster.wait_idle()
        for index in range(config.rounds):
            order = POLICIES[index % 3 :] + POLICIES[: index % 3]
            for workload, (make_shape, make_prompts) in WORKLOADS.items():
                shape = make_shape(config, rng)  # every policy of the round: the same lengths
                for policy in order:
                    result = run_policy(cluster, policy, make_prompts(config, shape, rng))
                    result["round"] = index
                    runs[workload][policy].append(result)
                    print(
                        f"round {index} {workload:7s} {policy:6s} {json.dumps(result)}",
                        file=sys.stderr,
                        flush=True,
                    )
    tenants, unique = summarize(runs["tenants"]), summarize(runs["unique"])
    return {
        "policies": tenants,
        "ratios": ratios(tenants),
        "no_shared_prefix": {"policies": unique, "ratios": ratios(unique)},
        "config": {
            **config.__dict__,
            "model_dir": str(model_dir),
            "num_engines": NUM_ENGINES,
            "worker_threads": 1,
            "cpu_count": os.cpu_count(),
        },
        "machine": {**machine_info(), "steal_share": steal_share(ticks, cpu_ticks())},
    }


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, str]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = BenchConfig()
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument(
        "--model",
        default=defaults.model,
        help=f"'smollm2', a model directory, or '{TINY}' (random weights, see TINY_SHAPE)",
    )
    parser.add_argument(
        "--num-blocks", type=int, default=defaults.num_blocks, help="KV blocks per engine"
    )
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.concurrency < 1 or args.num_blocks < 1:
        parser.error("--rounds, --concurrency and --num-blocks must be >= 1")
    config = BenchConfig(
        model=args.model,
        num_blocks=args.num_blocks,
        rounds=args.rounds,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    return config, args.out


TINY = "tiny-smollm2"
TINY_SHAPE = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}  # fmt: skip


def build_tiny_smollm2(out_dir: Path) -> Path:
    """SmolLM2-135M's tokenizer and architecture at a smaller shape (`TINY_SHAPE`, 16M
    parameters, 12.6M of them the tied embedding), random weights: the routing figures need
    the prefill work to be real, not the text to make sense."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pagedserve.services.gpu_worker.default_model import ensure_model

    source = ensure_model("smollm2")
    config = LlamaConfig(**{**json.loads((source / "config.json").read_text()), **TINY_SHAPE})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, out_dir / name)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    config, out = parse_args(argv)
    from pagedserve.services.gpu_worker.default_model import ensure_model

    if config.model == TINY:
        import tempfile

        model_dir = build_tiny_smollm2(Path(tempfile.mkdtemp(prefix="routing-tiny-")))
    else:
        model_dir = ensure_model(config.model)
    report = run(config, model_dir)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(
            {
                "policies": {
                    p: {k: v for k, v in r.items() if k != "rounds"}
                    for p, r in report["policies"].items()
                },
                "ratios": report["ratios"],
                "no_shared_prefix_ratios": report["no_shared_prefix"]["ratios"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
