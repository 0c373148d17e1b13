"""Which processes `pagedserve serve` starts, with which command lines: a pure function of the
options, the resolved model directory and the ports, so that it can be tested without
starting anything."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from pagedserve.services.cli.supervisor import ChildSpec
from pagedserve.shared.config import DEFAULT_SPECULATIVE_MAX_NUM_SEQS
from pagedserve.shared.options import option_argv
from pagedserve.shared.status import FINISHED_REQUEST_STATUS_TTL_S
from pagedserve.shared.transport import ipc_address

LOOPBACK = "127.0.0.1"
SERVE_ENGINE_WAIT_S = 120.0  # ~30-60 s for a worker's restart on a loaded 2-core box, doubled


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
    # None: the workers' device default (512 CPU, 1024 bf16 without AMX, 2048 CUDA)
    max_num_batched_tokens: int | None = None
    block_size: int | None = None  # None: the workers' device default (8 CPU, 16 CUDA)
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    num_speculative_tokens: int | None = None  # n-gram speculative decoding; 0: off; None: device's
    speculative_max_num_seqs: int = DEFAULT_SPECULATIVE_MAX_NUM_SEQS
    async_scheduling: bool = False  # plan each step while the last computes (one rank only)
    kv_cache_metrics: bool = False  # KV block residency histograms (vLLM's)
    kv_cache_metrics_sample: float = 0.01
    host: str = LOOPBACK
    port: int = 8000
    num_gateways: int = 1
    api_key: str | None = None
    redis_url: str | None = None  # None: start a private Redis server
    namespace: str = "pagedserve"
    engine_id: str = "engine0"
    shutdown_timeout: float = 30.0
    startup_timeout: float = 600.0
    # The gateways' and the scheduler's wait for a dead engine process: longer than their own
    # defaults (30 s, 60 s), since serve restarts it and a restart reloads torch and the model.
    engine_loss_timeout: float = SERVE_ENGINE_WAIT_S
    worker_recovery_timeout: float = SERVE_ENGINE_WAIT_S
    step_timeout: float = 60.0
    finished_request_ttl: int = FINISHED_REQUEST_STATUS_TTL_S  # seconds, the scheduler's
    routing: str = "cache"  # the gateways' (services/gateway/router.py)
    # the gateways' limits on what one request or client may cost (shared/options.py)
    max_body_bytes: int = 8 * 1024 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_seqs_per_request: int = 256
    max_requests_per_client: int = 1024
    tokenizer_threads: int = 2
    # tool_choice "auto" (the gateways read tool calls from the text)
    chat_template: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None


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


def _python(module: str, argv: list[str]) -> list[str]:
    return [sys.executable, "-P", "-m", module, *argv]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment, unbuffered so that log lines (and ready lines) arrive at once."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


def engine_links(ports: Ports, socket_dir: str | None) -> dict[str, object]:
    """Where the scheduler and its workers meet: ipc:// sockets in `socket_dir` (a private
    0700 directory: no other local user can subscribe to the plans), else TCP on loopback."""
    if socket_dir is None:
        return {"plan_port": ports.plan, "result_port": ports.result}
    return {
        "plan_address": ipc_address(socket_dir, "plan"),
        "result_address": ipc_address(socket_dir, "result"),
    }


def scheduler_spec(
    options: ServeOptions, redis_url: str, ports: Ports, socket_dir: str | None = None
) -> ChildSpec:
    """Only an explicit block size and token budget are passed (None is left out): without
    them the workers pick their device's defaults and the scheduler adopts them."""
    argv = option_argv({
        "redis_url": redis_url,
        "namespace": options.namespace,
        "engine_id": options.engine_id,
        "host": LOOPBACK,
        **engine_links(ports, socket_dir),
        "tensor_parallel_size": options.tensor_parallel_size,
        "max_num_seqs": options.max_num_seqs,
        "policy": options.scheduling_policy,
        "num_speculative_tokens": options.num_speculative_tokens,
        "speculative_max_num_seqs": options.speculative_max_num_seqs,
        "async_scheduling": options.async_scheduling,
        "block_size": options.block_size,
        "max_num_batched_tokens": options.max_num_batched_tokens,
        "max_model_len": options.max_model_len,
        "no_prefix_caching": not options.enable_prefix_caching,
        "kv_cache_metrics": options.kv_cache_metrics,
        "kv_cache_metrics_sample": options.kv_cache_metrics_sample,
        "worker_recovery_timeout": options.worker_recovery_timeout,
        "step_timeout": options.step_timeout,
        "finished_request_ttl": options.finished_request_ttl,
    })  # fmt: skip
    return ChildSpec(
        "scheduler",
        _python("pagedserve.services.scheduler", argv),
        ready_line="scheduler ready",
        env=child_env(),
    )


def worker_spec(
    options: ServeOptions, model_dir: str, ports: Ports, rank: int, socket_dir: str | None = None
) -> ChildSpec:
    argv = option_argv({
        "model": model_dir,
        "dtype": options.dtype,
        "rank": rank,
        "tensor_parallel_size": options.tensor_parallel_size,
        "scheduler_host": LOOPBACK,
        **engine_links(ports, socket_dir),
        "master_addr": LOOPBACK,
        "master_port": ports.master,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "attention_backend": options.attention_backend,
        "device": options.device,
        "block_size": options.block_size,
        "max_num_batched_tokens": options.max_num_batched_tokens,
        "kv_cache_memory": options.kv_cache_memory,
        "max_model_len": options.max_model_len,
        "max_num_seqs": options.max_num_seqs,
    })  # fmt: skip
    return ChildSpec(
        f"worker{rank}",
        _python("pagedserve.services.gpu_worker", argv),
        ready_line=f"worker {rank} ready",
        env=child_env(),
    )


def gateway_spec(
    options: ServeOptions,
    model_dir: str,
    redis_url: str,
    port: int,
    index: int,
    generation: int = 0,
) -> ChildSpec:
    """Replica `index` on `port`. A restarted replica (`generation` > 0) takes a new gateway
    id: the engines then see the old id's heartbeat expire and abort what its clients, who
    left with it, had asked for."""
    gateway_id = f"{options.engine_id}-gateway{index}" + (f"-r{generation}" if generation else "")
    argv = option_argv({
        "model": model_dir,
        "served_model_name": options.served_model_name or options.model,
        "redis_url": redis_url,
        "namespace": options.namespace,
        "host": options.host,
        "port": port,
        "gateway_id": gateway_id,
        "shutdown_timeout": options.shutdown_timeout,
        "engine_loss_timeout": options.engine_loss_timeout,
        "routing": options.routing,
        "max_model_len": options.max_model_len,
        "max_body_bytes": options.max_body_bytes,
        "header_timeout": options.header_timeout,
        "body_timeout": options.body_timeout,
        "max_seqs_per_request": options.max_seqs_per_request,
        "max_requests_per_client": options.max_requests_per_client,
        "tokenizer_threads": options.tokenizer_threads,
        "chat_template": options.chat_template,
        "enable_auto_tool_choice": options.enable_auto_tool_choice,
        "tool_call_parser": options.tool_call_parser,
    })  # fmt: skip
    # The key goes through the environment: a command line is visible to every local user.
    env = child_env({"PAGEDSERVE_API_KEY": options.api_key} if options.api_key else None)
    if not options.api_key:
        env.pop("PAGEDSERVE_API_KEY", None)
    name = "gateway" if options.num_gateways == 1 else f"gateway{index}"
    return ChildSpec(name, _python("pagedserve.services.gateway", argv), env=env)


def plan_launch(
    options: ServeOptions,
    model_dir: str,
    redis_url: str,
    ports: Ports,
    socket_dir: str | None = None,
) -> LaunchPlan:
    """The engine (scheduler + TP workers) and the gateway replicas, one per port; the
    engine's ZeroMQ sockets in `socket_dir` when given (ipc://), else on loopback TCP."""
    engine = [scheduler_spec(options, redis_url, ports, socket_dir)]
    engine += [
        worker_spec(options, model_dir, ports, r, socket_dir)
        for r in range(options.tensor_parallel_size)
    ]
    gateways = [
        gateway_spec(options, model_dir, redis_url, port, i)
        for i, port in enumerate(ports.gateway_ports(options))
    ]
    return LaunchPlan(engine=engine, gateways=gateways)
