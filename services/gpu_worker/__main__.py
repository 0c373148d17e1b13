"""`python -m pagedserve.services.gpu_worker`: one worker rank. Every flag also reads from
`PAGEDSERVE_<FLAG>` (e.g. `PAGEDSERVE_RANK=1`)."""

from __future__ import annotations

import argparse
import signal
import sys

from pagedserve.shared.config import CacheConfig
from pagedserve.shared.logging import setup_logging
from pagedserve.shared.options import add_options, use
from pagedserve.shared.startup_heap import freeze_startup_heap

WORKER_OPTIONS = (
    use("model", help="alias or model directory"), use("dtype", choices=None), "rank",
    "tensor_parallel_size", "scheduler_host", "plan_port", "result_port",
    "plan_address", "result_address", "master_addr", "master_port",
    "block_size", "kv_cache_memory", "num_blocks", "gpu_memory_utilization",
    "attention_backend", "device", "max_model_len", "max_num_batched_tokens", "scheduler_timeout",
    use("max_num_seqs", help="sampler rows of the worst step the CUDA memory profile runs"),
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pagedserve.services.gpu_worker", description=__doc__
    )
    add_options(p, *WORKER_OPTIONS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.rank < args.tensor_parallel_size:
        print(
            f"--rank must be in [0, --tensor-parallel-size={args.tensor_parallel_size}), "
            f"got {args.rank}",
            file=sys.stderr,
        )
        return 2
    logger = setup_logging(f"worker{args.rank}")
    # Imported here so that `--help` and flag errors do not pay for importing torch.
    from pagedserve.services.gpu_worker.cpu_threads import ThreadGovernor
    from pagedserve.services.gpu_worker.model_runner import ModelRunner
    from pagedserve.services.gpu_worker.parallel_state import init_tensor_parallel
    from pagedserve.services.gpu_worker.worker_loop import WorkerLoop

    init_tensor_parallel(args.rank, args.tensor_parallel_size, args.master_addr, args.master_port)
    cache_config = CacheConfig(
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    runner = ModelRunner(
        args.model,
        cache_config,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        device=None if args.device == "auto" else args.device,
        attention_backend=args.attention_backend,
        max_num_batched_tokens=args.max_num_batched_tokens,
        show_progress=args.rank == 0,
        max_num_seqs=args.max_num_seqs,
    )
    loop = WorkerLoop(
        runner,
        rank=args.rank,
        world_size=args.tensor_parallel_size,
        plan_address=args.plan_address or f"tcp://{args.scheduler_host}:{args.plan_port}",
        result_address=args.result_address or f"tcp://{args.scheduler_host}:{args.result_port}",
        model_name=str(args.model),
        scheduler_timeout_s=args.scheduler_timeout,
        thread_governor=ThreadGovernor.for_worker(runner.device, args.tensor_parallel_size),
    )
    signal.signal(signal.SIGTERM, lambda *_: loop.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: loop.stop_event.set())
    logger.info("%d start-up objects frozen", freeze_startup_heap())
    loop.run()
    logger.info("worker %d exits", args.rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
