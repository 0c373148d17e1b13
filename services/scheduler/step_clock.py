"""Where an engine's steps spend their time, as running totals: the worker computing, the link
carrying plans and results, and the scheduler's own work between two steps.

    one step:  intake, schedule | publish, worker executes | result in ... update_from_output
               |-- scheduling ----|---- in flight (execute + transport) ----|-- scheduling --|

(the second scheduling part also waits for whatever Redis I/O of the step is still running)

`worker_execute_s` is rank 0's own measure of `execute` (StepResult.execute_time_s);
`in_flight_s - worker_execute_s` is the link and the wake-ups on both sides. Without async
scheduling the worker is idle for the scheduling part; with it, a plan made ahead waits at the
worker while the last one computes, so its time in flight counts from the last result on
(`planned_ahead` counts those steps), and the scheduling overlaps the model. Either way
`worker_execute_s / elapsed wall time` is how busy the model is kept: what vLLM reports as
model-execute time against step time.
The totals go into the engine's status record and out as `/metrics` counters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True)
class StepClock:
    scheduling_s: float = 0.0  # between steps: before publishing, and after the result
    in_flight_s: float = 0.0  # publish -> rank 0's result received
    worker_execute_s: float = 0.0  # rank 0's execute() time, summed over its results
    planned_ahead: int = 0  # steps planned before the last one's result (async scheduling)

    def start(self) -> float:
        return time.perf_counter()

    def published(self, started: float) -> float:
        now = time.perf_counter()
        self.scheduling_s += now - started
        return now

    def received(self, published: float, execute_time_s: float) -> float:
        now = time.perf_counter()
        self.in_flight_s += now - published
        self.worker_execute_s += execute_time_s
        return now

    def updated(self, received: float) -> None:
        self.scheduling_s += time.perf_counter() - received
