"""How long a full garbage collection stops a worker, with and without its start-up objects
frozen (`shared/startup_heap.py`): the default model loaded as a worker loads it, then
`gc.collect()` timed a few times each way.

    python -m benchmarks.gc_pause [--dtype bfloat16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from pagedserve.shared.startup_heap import freeze_startup_heap


def full_collection_ms(rounds: int) -> float:
    """The median of `rounds` timed full collections, in ms."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from pagedserve.services.engine import LLMEngine
    from pagedserve.services.gpu_worker.default_model import ensure_default_model
    from pagedserve.shared.config import SchedulerConfig

    engine = LLMEngine(ensure_default_model(), SchedulerConfig(), dtype=args.dtype)
    tracked = len(gc.get_objects())
    before = full_collection_ms(args.rounds)
    frozen = freeze_startup_heap()
    after = full_collection_ms(args.rounds)
    print(f"objects the collector tracks with the model loaded: {tracked}")
    print(f"full collection, median of {args.rounds}: {before:.1f} ms; after freezing "
          f"{frozen} objects: {after:.2f} ms")  # fmt: skip
    del engine
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
