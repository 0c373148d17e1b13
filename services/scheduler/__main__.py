"""`python -m pagedserve.services.scheduler`: one engine's scheduler process. Every flag also
reads from `PAGEDSERVE_<FLAG>` (e.g. `PAGEDSERVE_ENGINE_ID=engine-1`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from pagedserve.services.scheduler.engine_loop import EngineLoop, EngineLoopConfig
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.logging import setup_logging
from pagedserve.shared.options import add_options, use
from pagedserve.shared.transport import TransportError

SCHEDULER_OPTIONS = (
    "redis_url", "redis_sentinel", "namespace", "engine_id",
    use("host", help="address to bind ZeroMQ on"), "plan_port", "result_port",
    "plan_address", "result_address",
    "tensor_parallel_size", "max_num_seqs",
    use("max_num_batched_tokens", help="default: what the workers report (their device's default)"),
    use("max_model_len", help="default: the smallest the workers report"),
    "max_waiting", "policy", "num_speculative_tokens", "speculative_max_num_seqs",
    "async_scheduling",
    use("block_size", help="default: what the workers report (their device's default)"),
    "no_prefix_caching", "kv_cache_metrics", "kv_cache_metrics_sample", "worker_timeout",
    "step_timeout", "drain_timeout",
    "worker_recovery_timeout", "finished_request_ttl",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.services.scheduler", description=__doc__)
    add_options(p, *SCHEDULER_OPTIONS)
    if p.get_default("engine_id") is None:
        p.set_defaults(engine_id=f"engine-{socket.gethostname()}-{os.getpid()}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logger = setup_logging("scheduler")
    try:
        config = EngineLoopConfig(
            engine_id=args.engine_id,
            redis_url=args.redis_url,
            redis_sentinel=args.redis_sentinel,
            namespace=args.namespace,
            plan_address=args.plan_address or f"tcp://{args.host}:{args.plan_port}",
            result_address=args.result_address or f"tcp://{args.host}:{args.result_port}",
            scheduler_config=SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len or 1 << 30,  # capped by the workers later
                max_waiting=args.max_waiting,
                policy=args.policy,
                num_speculative_tokens=args.num_speculative_tokens,
                speculative_max_num_seqs=args.speculative_max_num_seqs,
                async_scheduling=args.async_scheduling,
            ),
            cache_config=CacheConfig(
                block_size=args.block_size,
                enable_prefix_caching=not args.no_prefix_caching,
                kv_cache_metrics_sample=args.kv_cache_metrics_sample
                if args.kv_cache_metrics
                else 0.0,
            ),
            tensor_parallel_size=args.tensor_parallel_size,
            worker_timeout_s=args.worker_timeout,
            step_timeout_s=args.step_timeout,
            drain_timeout_s=args.drain_timeout,
            worker_recovery_timeout_s=args.worker_recovery_timeout,
            finished_request_ttl_s=args.finished_request_ttl,
        )
        config.redis_target  # noqa: B018 (a malformed --redis-sentinel fails here)
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
