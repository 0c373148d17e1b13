"""Where a pagedserve step's time goes during one benchmark level, from the engine's own
counters on /metrics: how many steps ran, how long the model computed each (the worker's
execute), and how long each plan was out beyond that (plan published to result received,
less the execute: the messages both ways, decoding the plan, sending the result, and the
waits for a core on a busy box).

The counters are those `run_levels` reads, settled, before and after every level
(`services/cli/loadgen/engine_time.py`: the level summary's `engine_time`, each counter's
growth over the level as a share of its wall time). A server without these counters (vLLM)
has no step clock: None.
"""

from __future__ import annotations

from typing import Any


def step_clock(engine_time: dict[str, float] | None, wall_s: float) -> dict[str, Any] | None:
    """Per step over a level that lasted `wall_s`, from its `engine_time` shares: the model's
    execute and the rest of the time its plan was out, in ms, and the share of the wall the
    model computed."""
    if engine_time is None:
        return None
    steps = engine_time["steps"]
    if steps <= 0 or wall_s <= 0:
        return None
    execute_s, in_flight_s = engine_time["execute"] * wall_s, engine_time["in_flight"] * wall_s
    return {
        "steps": int(steps),
        "execute_ms_per_step": 1e3 * execute_s / steps,
        "outside_execute_ms_per_step": 1e3 * (in_flight_s - execute_s) / steps,
        "execute_share": engine_time["execute"],
    }
