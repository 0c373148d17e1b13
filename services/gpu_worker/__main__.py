"""`python -m services.gpu_worker`: one worker rank. Every flag also reads from
`PAGEDSERVE_<FLAG>` (e.g. `PAGEDSERVE_RANK=1`)."""

from __future__ import annotations

import argparse
import signal
import sys

from shared.config import DEFAULT_MODEL, CacheConfig, env_default
from shared.logging import setup_logging


def _optional_int(text: str) -> int | None:
    return None if text in ("", "none", "None") else int(text)


def build_parser() -> argparse.ArgumentParser:
    e = env_default
    p = argparse.ArgumentParser(prog="python -m services.gpu_worker", description=__doc__)
    p.add_argument("--model", default=e("model", DEFAULT_MODEL))
    p.add_argument("--dtype", default=e("dtype", "auto"))
    p.add_argument("--rank", type=int, default=int(e("rank", "0")))
    p.add_argument("--tensor-parallel-size", type=int, default=int(e("tensor_parallel_size", "1")))
    p.add_argument("--scheduler-host", default=e("scheduler_host", "127.0.0.1"))
    p.add_argument("--plan-port", type=int, default=int(e("plan_port", "5555")))
    p.add_argument("--result-port", type=int, default=int(e("result_port", "5556")))
    p.add_argument("--master-addr", default=e("master_addr", "127.0.0.1"))
    p.add_argument("--master-port", type=int, default=int(e("master_port", "29555")))
    p.add_argument(
        "--block-size",
        type=_optional_int,
        default=e("block_size", ""),
        help="KV tokens per block; default: 8 on CPU, 16 on CUDA",
    )
    p.add_argument("--kv-cache-memory", type=_optional_int, default=e("kv_cache_memory", ""))
    p.add_argument("--num-blocks", type=_optional_int, default=e("num_blocks", ""))
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=float(e("gpu_memory_utilization", "0.9"))
    )
    p.add_argument(
        "--attention-backend",
        default=e("attention_backend", "auto"),
        choices=["auto", "torch", "triton"],
    )
    p.add_argument("--device", default=e("device", "auto"), choices=["auto", "cpu", "cuda"])
    p.add_argument("--max-model-len", type=_optional_int, default=e("max_model_len", ""))
    p.add_argument(
        "--max-num-batched-tokens",
        type=_optional_int,
        default=e("max_num_batched_tokens", ""),
        help="tokens computed in one step; default: 512 on CPU, 2048 on CUDA",
    )
    p.add_argument(
        "--max-num-seqs",
        type=_optional_int,
        default=e("max_num_seqs", ""),
        help="sampler rows of the worst step the CUDA memory profile runs; default 256",
    )
    p.add_argument(
        "--scheduler-timeout",
        type=float,
        default=float(e("scheduler_timeout", "10")),
        help="seconds without a scheduler heartbeat before dropping state and re-attaching",
    )
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
    from services.gpu_worker.model_runner import ModelRunner
    from services.gpu_worker.parallel_state import init_tensor_parallel
    from services.gpu_worker.worker_loop import WorkerLoop

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
        plan_address=f"tcp://{args.scheduler_host}:{args.plan_port}",
        result_address=f"tcp://{args.scheduler_host}:{args.result_port}",
        model_name=str(args.model),
        scheduler_timeout_s=args.scheduler_timeout,
    )
    signal.signal(signal.SIGTERM, lambda *_: loop.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: loop.stop_event.set())
    loop.run()
    logger.info("worker %d exits", args.rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
