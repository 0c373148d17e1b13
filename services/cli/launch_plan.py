"""Which processes `pagedserve serve` starts, with which command lines: a pure function of the
options, the resolved model directory and the ports, so that it can be tested without
starting anything."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from services.cli.supervisor import ChildSpec

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServeOptions:
    """`pagedserve serve` flags (vLLM's names where the meaning is the same)."""

    model: str = "smollm2"
    served_model_name: str | None = None
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    # None: the workers' device default (512 CPU, 2048 CUDA)
    max_num_batched_tokens: int | None = None
    block_size: int | None = None  # None: the workers' device default (8 CPU, 16 CUDA)
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    host: str = LOOPBACK
    port: int = 8000
    num_gateways: int = 1
    api_key: str | None = None
    redis_url: str | None = None  # None: start a private Redis server
    namespace: str = "pagedserve"
    engine_id: str = "engine0"
    shutdown_timeout: float = 30.0
    startup_timeout: float = 600.0


@dataclass(frozen=True)
class Ports:
    redis: int
    plan: int
    result: int
    master: int

    def gateway_ports(self, options: ServeOptions) -> list[int]:
        return [options.port + i for i in range(options.num_gateways)]


@dataclass(frozen=True)
class LaunchPlan:
    engine: list[ChildSpec]  # the scheduler, then one worker per TP rank
    gateways: list[ChildSpec] = field(default_factory=list)


def _python(module: str, *args: object) -> list[str]:
    return [sys.executable, "-m", module, *(str(a) for a in args)]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment, unbuffered so that log lines (and ready lines) arrive at once."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


def _device_default_args(options: ServeOptions) -> list[str]:
    """Only an explicit block size and token budget are passed: without them the workers pick
    their device's defaults and the scheduler adopts them from their hello."""
    args: list[str] = []
    if options.block_size is not None:
        args += ["--block-size", str(options.block_size)]
    if options.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(options.max_num_batched_tokens)]
    return args


def scheduler_spec(options: ServeOptions, redis_url: str, ports: Ports) -> ChildSpec:
    argv = _python(
        "services.scheduler",
        "--redis-url", redis_url,
        "--namespace", options.namespace,
        "--engine-id", options.engine_id,
        "--host", LOOPBACK,
        "--plan-port", ports.plan,
        "--result-port", ports.result,
        "--tensor-parallel-size", options.tensor_parallel_size,
        "--max-num-seqs", options.max_num_seqs,
        "--policy", options.scheduling_policy,
    )  # fmt: skip
    argv += _device_default_args(options)
    if options.max_model_len is not None:
        argv += ["--max-model-len", str(options.max_model_len)]
    if not options.enable_prefix_caching:
        argv.append("--no-prefix-caching")
    return ChildSpec("scheduler", argv, ready_line="scheduler ready", env=child_env())


def worker_spec(options: ServeOptions, model_dir: str, ports: Ports, rank: int) -> ChildSpec:
    argv = _python(
        "services.gpu_worker",
        "--model", model_dir,
        "--dtype", options.dtype,
        "--rank", rank,
        "--tensor-parallel-size", options.tensor_parallel_size,
        "--scheduler-host", LOOPBACK,
        "--plan-port", ports.plan,
        "--result-port", ports.result,
        "--master-addr", LOOPBACK,
        "--master-port", ports.master,
        "--gpu-memory-utilization", options.gpu_memory_utilization,
        "--attention-backend", options.attention_backend,
        "--device", options.device,
        "--max-num-seqs", options.max_num_seqs,
    )  # fmt: skip
    argv += _device_default_args(options)
    if options.kv_cache_memory is not None:
        argv += ["--kv-cache-memory", str(options.kv_cache_memory)]
    if options.max_model_len is not None:
        argv += ["--max-model-len", str(options.max_model_len)]
    return ChildSpec(f"worker{rank}", argv, ready_line=f"worker {rank} ready", env=child_env())


def gateway_spec(
    options: ServeOptions, model_dir: str, redis_url: str, port: int, index: int
) -> ChildSpec:
    argv = _python(
        "services.gateway",
        "--model", model_dir,
        "--served-model-name", options.served_model_name or options.model,
        "--redis-url", redis_url,
        "--namespace", options.namespace,
        "--host", options.host,
        "--port", port,
        "--gateway-id", f"{options.engine_id}-gateway{index}",
        "--shutdown-timeout", options.shutdown_timeout,
    )  # fmt: skip
    if options.max_model_len is not None:
        argv += ["--max-model-len", str(options.max_model_len)]
    # The key goes through the environment: a command line is visible to every local user.
    env = child_env({"PAGEDSERVE_API_KEY": options.api_key} if options.api_key else None)
    if not options.api_key:
        env.pop("PAGEDSERVE_API_KEY", None)
    name = "gateway" if options.num_gateways == 1 else f"gateway{index}"
    return ChildSpec(name, argv, env=env)


def plan_launch(options: ServeOptions, model_dir: str, redis_url: str, ports: Ports) -> LaunchPlan:
    """The engine (scheduler + TP workers) and the gateway replicas, one per port."""
    engine = [scheduler_spec(options, redis_url, ports)]
    engine += [
        worker_spec(options, model_dir, ports, r) for r in range(options.tensor_parallel_size)
    ]
    gateways = [
        gateway_spec(options, model_dir, redis_url, port, i)
        for i, port in enumerate(ports.gateway_ports(options))
    ]
    return LaunchPlan(engine=engine, gateways=gateways)
