"""`pagedserve serve`: the whole pipeline on this machine, supervised.

Starts a private Redis (unless --redis-url / REDIS_URL names one), the scheduler, one worker
per tensor-parallel rank and the gateway replica(s) (ports PORT, PORT+1, ...), waits until
each is ready, then watches them. A child that dies is reported (name, exit status, last log
lines) and everything is stopped. SIGTERM or Ctrl-C drains: the gateways refuse new requests
(503), open ones get --shutdown-timeout seconds before they end with finish_reason "abort",
then the engine and Redis stop. A second Ctrl-C stops everything at once.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from dataclasses import fields

from pagedserve.services.cli.launch_plan import SERVE_ENGINE_WAIT_S, Ports, ServeOptions
from pagedserve.services.cli.local_cluster import LocalCluster
from pagedserve.services.cli.ports import free_port, is_port_free
from pagedserve.services.cli.redis_launcher import RedisNotFoundError, find_redis_server
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.logging import setup_logging
from pagedserve.shared.model_files import ModelNotFoundError, is_default_alias, resolve_model_dir
from pagedserve.shared.options import add_options, use


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the whole pipeline on this machine (Redis, scheduler, workers, gateway)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_arguments(parser)
    parser.set_defaults(func=run, parser=parser)


SERVE_OPTIONS = (
    "model", "served_model_name", "tensor_parallel_size", "dtype", "device",
    "attention_backend", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
    "gpu_memory_utilization", "kv_cache_memory", "enable_prefix_caching", "scheduling_policy",
    "num_speculative_tokens", "speculative_max_num_seqs", "async_scheduling", "kv_cache_metrics",
    "kv_cache_metrics_sample",
    use("host", help="gateway bind address (default: loopback)"), "port", "num_gateways",
    "api_key",
    use("redis_url", default=None, env_aliases=("REDIS_URL",),
        help="default: $REDIS_URL, else a private redis-server"),
    "namespace", use("engine_id", help="default: engine-HOSTNAME-PID"),
    use("shutdown_timeout", help="seconds open requests get on SIGTERM/Ctrl-C"),
    "startup_timeout",
    # serve restarts a dead engine process itself: open requests wait for it
    use("engine_loss_timeout", default=SERVE_ENGINE_WAIT_S,
        help="seconds the gateways keep open requests while no engine is live"),
    use("worker_recovery_timeout", default=SERVE_ENGINE_WAIT_S,
        help="seconds the scheduler keeps unfinished requests while it has no workers"),
    "routing", "step_timeout", "finished_request_ttl", "max_body_bytes", "header_timeout",
    "body_timeout", "max_seqs_per_request", "max_requests_per_client", "tokenizer_threads",
    "chat_template", "enable_auto_tool_choice", "tool_call_parser",
)  # fmt: skip


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag also reads `PAGEDSERVE_<FLAG>` (REDIS_URL too for --redis-url)."""
    add_options(parser, *SERVE_OPTIONS)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """Validated options; ValueError says which flag is wrong and the bound it broke."""
    values = {f.name: getattr(args, f.name) for f in fields(ServeOptions) if hasattr(args, f.name)}
    if not values.get("engine_id"):
        values["engine_id"] = f"engine-{socket.gethostname()}-{os.getpid()}"
    options = ServeOptions(**values)
    _check_bounds(options)
    return options


def _check_bounds(o: ServeOptions) -> None:
    problems = []
    if o.tensor_parallel_size < 1:
        problems.append(f"--tensor-parallel-size must be >= 1, got {o.tensor_parallel_size}")
    if o.num_gateways < 1:
        problems.append(f"--num-gateways must be >= 1, got {o.num_gateways}")
    if not 1 <= o.port <= 65535 - (o.num_gateways - 1):
        last = o.port + o.num_gateways - 1
        problems.append(
            f"--port must keep PORT..PORT+{o.num_gateways - 1} in 1..65535, got {o.port}..{last}"
        )
    if o.shutdown_timeout < 0:
        problems.append(f"--shutdown-timeout must be >= 0, got {o.shutdown_timeout}")
    for flag, value in (("--engine-loss-timeout", o.engine_loss_timeout),
                        ("--worker-recovery-timeout", o.worker_recovery_timeout)):  # fmt: skip
        if value <= 0:
            problems.append(f"{flag} must be > 0, got {value}")
    if o.finished_request_ttl < 1:
        problems.append(f"--finished-request-ttl must be >= 1, got {o.finished_request_ttl}")
    if o.startup_timeout <= 0:
        problems.append(f"--startup-timeout must be > 0, got {o.startup_timeout}")
    if o.kv_cache_memory is not None and o.kv_cache_memory < 1:
        problems.append(f"--kv-cache-memory must be >= 1 byte, got {o.kv_cache_memory}")
    if o.api_key == "":
        problems.append("--api-key must not be empty (leave it out to turn auth off)")
    try:
        CacheConfig(
            block_size=o.block_size,
            gpu_memory_utilization=o.gpu_memory_utilization,
            kv_cache_metrics_sample=o.kv_cache_metrics_sample if o.kv_cache_metrics else 0.0,
        )
        SchedulerConfig(
            max_num_seqs=o.max_num_seqs,
            max_num_batched_tokens=o.max_num_batched_tokens,
            max_model_len=o.max_model_len or 1 << 30,
            policy=o.scheduling_policy,
            num_speculative_tokens=o.num_speculative_tokens,
            speculative_max_num_seqs=o.speculative_max_num_seqs,
        )
    except ValueError as exc:
        problems.append(str(exc).replace("_", "-"))
    if o.async_scheduling and o.tensor_parallel_size != 1:
        problems.append(
            "--async-scheduling needs --tensor-parallel-size 1 (only rank 0 samples), "
            f"got {o.tensor_parallel_size}"
        )
    if problems:
        raise ValueError("; ".join(problems))


def pick_ports(options: ServeOptions) -> Ports:
    """Free loopback ports for the engine; the gateway ports must be free as given."""
    for port in Ports(0, 0, 0, 0).gateway_ports(options):
        if not is_port_free(port, options.host):
            raise ValueError(
                f"port {port} on {options.host} is in use (another pagedserve?): "
                "stop it or pass --port"
            )
    return Ports(redis=free_port(), plan=free_port(), result=free_port(), master=free_port())


def resolve_model(model: str) -> str:
    """The model directory the workers and gateways load; converts the default model once."""
    if is_default_alias(model):
        from pagedserve.services.gpu_worker.default_model import ensure_default_model

        return str(ensure_default_model())
    return str(resolve_model_dir(model))


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
        ports = pick_ports(options)
    except ValueError as exc:
        args.parser.error(str(exc))
    setup_logging("serve")
    try:
        find_redis_server() if options.redis_url is None else None
        model_dir = resolve_model(options.model)
    except (RedisNotFoundError, ModelNotFoundError) as exc:
        print(f"pagedserve serve: error: {exc}", file=sys.stderr)
        return 1
    return LocalCluster(options, ports).run(model_dir)
