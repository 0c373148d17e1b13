"""Measuring a load level again when the hypervisor took too much of the CPU during it.

On a shared VM the hypervisor sometimes gives our virtual CPUs' turns to other guests for
minutes at a time (`st` in vmstat: 20-45% on the development VM at its worst). A level
measured then ran on a slower machine, and since the two servers of a comparison run one
after the other, a burst during one of them goes straight into their ratio. So each level is
run again, with fresh words of the same lengths (a server's prefix cache holds none of them),
while the stolen share of its CPU time is over `max_steal`, up to `max_attempts` runs. Both
servers get the same rule; the attempts set aside are kept in the level's summary. HF
`generate`'s run goes through the same rule (`measure`), on the same requests.

    attempt 0: the level's own requests            -> kept if steal <= max_steal
    attempt k: fresh words, seed `seed + index + 1000 * k`   (the last attempt is kept anyway)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.machine_info import cpu_ticks, steal_share
from pagedserve.services.cli.loadgen.runner import Level, run_levels
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import with_fresh_words

SEED_STRIDE = 1000  # attempts' seeds lie this far apart, past every level's own seed


@dataclass(frozen=True)
class StealGuard:
    tokenizer: Any
    seed: int
    max_steal: float = 0.10
    max_attempts: int = 3
    ticks: Callable[[], tuple[int, int]] = cpu_ticks  # (all, stolen) CPU ticks so far

    def fresh(self, index: int, level: Level, attempt: int) -> Level:
        """Level `index` for `attempt` > 0: the same lengths, new words."""
        seed = self.seed + index + SEED_STRIDE * attempt
        return Level(level.load, with_fresh_words(level.requests, self.tokenizer, seed), True)

    def measure(self, run: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
        """`run(attempt)`'s summary for the first attempt whose stolen share is low enough
        (else the last), with its `steal_share` and the `set_aside` attempts before it."""
        set_aside: list[dict[str, Any]] = []
        attempt = 0
        while True:
            before = self.ticks()
            summary = run(attempt)
            summary["steal_share"] = stolen = steal_share(before, self.ticks())
            attempt += 1
            if stolen is None or stolen <= self.max_steal or attempt >= self.max_attempts:
                summary["set_aside"] = set_aside
                return summary
            print(
                f"the hypervisor took {100 * stolen:.0f}% of the CPU during that run (more "
                f"than {100 * self.max_steal:.0f}%): measuring it again",
                flush=True,
            )
            set_aside.append(
                {"output_throughput": summary["output_throughput"], "steal_share": stolen}
            )

    def run_level(
        self, index: int, level: Level, run: Callable[[Level], dict[str, Any]]
    ) -> dict[str, Any]:
        """Level `index` through `measure`, each attempt after the first with fresh words."""
        return self.measure(
            lambda attempt: run(level if attempt == 0 else self.fresh(index, level, attempt))
        )


def run_guarded_levels(
    endpoint: EndpointConfig, levels: list[Level], guard: StealGuard | None
) -> list[dict[str, Any]]:
    """Every level in turn, each through `guard` (once, unguarded, where it is None)."""
    if guard is None:
        return run_levels(endpoint, levels)

    def run(level: Level) -> dict[str, Any]:
        return run_levels(endpoint, [level])[0]

    return [guard.run_level(i, level, run) for i, level in enumerate(levels)]
