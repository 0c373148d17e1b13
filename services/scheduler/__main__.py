"""`python -m services.scheduler`: one engine's scheduler process. Every flag also reads from
`PAGEDSERVE_<FLAG>` (e.g. `PAGEDSERVE_ENGINE_ID=engine-1`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from services.scheduler.engine_loop import EngineLoop, EngineLoopConfig
from shared.config import DEFAULT_NAMESPACE, CacheConfig, SchedulerConfig, env_default
from shared.logging import setup_logging
from shared.transport import TransportError


def _optional_int(text: str) -> int | None:
    return None if text in ("", "none", "None") else int(text)


def _flag(name: str) -> bool:
    return env_default(name, "").lower() in ("1", "true", "yes")


def build_parser() -> argparse.ArgumentParser:
    e = env_default
    p = argparse.ArgumentParser(prog="python -m services.scheduler", description=__doc__)
    p.add_argument("--redis-url", default=e("redis_url", "redis://127.0.0.1:6379/0"))
    p.add_argument("--namespace", default=e("namespace", DEFAULT_NAMESPACE))
    p.add_argument(
        "--engine-id", default=e("engine_id", f"engine-{socket.gethostname()}-{os.getpid()}")
    )
    p.add_argument("--host", default=e("host", "127.0.0.1"), help="address to bind ZeroMQ on")
    p.add_argument("--plan-port", type=int, default=int(e("plan_port", "5555")))
    p.add_argument("--result-port", type=int, default=int(e("result_port", "5556")))
    p.add_argument("--tensor-parallel-size", type=int, default=int(e("tensor_parallel_size", "1")))
    p.add_argument("--max-num-seqs", type=int, default=int(e("max_num_seqs", "256")))
    p.add_argument(
        "--max-num-batched-tokens",
        type=_optional_int,
        default=e("max_num_batched_tokens", ""),
        help="default: what the workers report (their device's default)",
    )
    p.add_argument(
        "--max-model-len",
        type=_optional_int,
        default=e("max_model_len", ""),
        help="default: the smallest the workers report",
    )
    p.add_argument("--max-waiting", type=int, default=int(e("max_waiting", "4096")))
    p.add_argument("--policy", default=e("policy", "fcfs"), choices=["fcfs", "priority"])
    p.add_argument(
        "--block-size",
        type=_optional_int,
        default=e("block_size", ""),
        help="default: what the workers report (their device's default)",
    )
    p.add_argument("--no-prefix-caching", action="store_true", default=_flag("no_prefix_caching"))
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=float(e("worker_timeout", "10")),
        help="seconds without a heartbeat after which a worker rank is lost",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=float(e("step_timeout", "60")),
        help="seconds a step's result may take (a worker that heartbeats is alive meanwhile)",
    )
    p.add_argument("--drain-timeout", type=float, default=float(e("drain_timeout", "5")))
    p.add_argument(
        "--worker-recovery-timeout",
        type=float,
        default=float(e("worker_recovery_timeout", "60")),
        help="seconds without workers after which unfinished requests are failed",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logger = setup_logging("scheduler")
    try:
        config = EngineLoopConfig(
            engine_id=args.engine_id,
            redis_url=args.redis_url,
            namespace=args.namespace,
            plan_address=f"tcp://{args.host}:{args.plan_port}",
            result_address=f"tcp://{args.host}:{args.result_port}",
            scheduler_config=SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len or 1 << 30,  # capped by the workers later
                max_waiting=args.max_waiting,
                policy=args.policy,
            ),
            cache_config=CacheConfig(
                block_size=args.block_size, enable_prefix_caching=not args.no_prefix_caching
            ),
            tensor_parallel_size=args.tensor_parallel_size,
            worker_timeout_s=args.worker_timeout,
            step_timeout_s=args.step_timeout,
            drain_timeout_s=args.drain_timeout,
            worker_recovery_timeout_s=args.worker_recovery_timeout,
        )
    except ValueError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_run(config, logger))


async def _run(config: EngineLoopConfig, logger: logging.Logger) -> int:
    loop = EngineLoop(config)
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, loop.request_stop)
    try:
        await loop.run()
    except TransportError as exc:
        logger.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
