"""A step plan's round trip through the real transport, scheduler to worker and back, with
nothing computed in between: what each step pays for its messages alone.

The scheduler side (this process) publishes a plan of N decoding sequences with
`LoopPlanPublisher` and takes the result from `LoopResultPuller`'s reader callback, as the
engine loop does;
a worker process receives it on `PlanSubscriber` and answers at once on `ResultPusher`. Each
round trip crosses six threads (each side's main thread and ZeroMQ I/O thread), and the
round trips are spaced by a pause, as the steps are, so that each one wakes the threads
anew. The in-process encode + decode of the same plan and result is timed beside it: the
rest of the round trip is the messaging.

    python -m benchmarks.transport_rtt --num-seqs 1,64,256 --transports ipc,tcp
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from benchmarks.bench_args import ints
from benchmarks.machine_info import machine_info
from pagedserve.services.cli.loadgen.runner import write_json
from pagedserve.services.cli.ports import free_port
from pagedserve.shared.protocol import CachedSequence, StepPlan, StepResult, decode, encode
from pagedserve.shared.transport import (
    LoopPlanPublisher,
    LoopResultPuller,
    PlanSubscriber,
    ResultPusher,
    ipc_address,
    private_socket_dir,
)

READY_STEP_ID = -1  # the plan the scheduler side repeats until the worker's subscription is live


def decode_plan(num_seqs: int, step_id: int) -> StepPlan:
    seqs = [
        CachedSequence(
            seq_id=f"cmpl-{i:032x}-0",
            new_token_ids=[5],
            new_block_ids=[],
            num_computed_tokens=100,
            num_scheduled_tokens=1,
            draft_token_ids=[],
        )
        for i in range(num_seqs)
    ]
    return StepPlan(
        step_id=step_id,
        new_seqs=[],
        cached_seqs=seqs,
        finished_seq_ids=[],
        preempted_seq_ids=[],
        block_copies=[],
    )


def answer(plan: StepPlan) -> StepResult:
    ids = [s.seq_id for s in plan.cached_seqs]
    return StepResult(step_id=plan.step_id, seq_ids=ids, token_ids=[1] * len(ids))


def echo_worker(plan_address: str, result_address: str) -> None:
    """Answer every plan at once, until killed."""
    context = zmq.Context()
    plans = PlanSubscriber(context, plan_address)
    results = ResultPusher(context, result_address)
    while True:
        message = plans.recv(timeout_s=0.2)
        if isinstance(message, StepPlan):
            results.send(answer(message))


def addresses(transport: str) -> tuple[str, str]:
    if transport == "ipc":
        socket_dir = private_socket_dir()
        return ipc_address(socket_dir, "plan"), ipc_address(socket_dir, "result")
    if transport == "tcp":
        return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    raise ValueError(f"transport must be ipc or tcp, got {transport!r}")


async def round_trips(transport: str, num_seqs: int, num_trips: int, pause_s: float) -> list[float]:
    """Milliseconds of each plan-out-to-result-in round trip."""
    plan_address, result_address = addresses(transport)
    context = zmq.Context()
    publisher = LoopPlanPublisher(context, plan_address)
    puller = LoopResultPuller(context, result_address)
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    puller.start_reading(inbox.put_nowait)
    worker = multiprocessing.get_context("spawn").Process(
        target=echo_worker, args=(plan_address, result_address), daemon=True
    )
    worker.start()
    try:
        await wait_for_subscription(publisher, inbox)
        trips = []
        for step_id in range(num_trips):
            plan = decode_plan(num_seqs, step_id)
            started = time.perf_counter()
            publisher.send(plan)
            result = await asyncio.wait_for(inbox.get(), 30)
            if not isinstance(result, StepResult) or result.step_id != step_id:
                raise RuntimeError(f"step {step_id}: the worker answered {result!r}")
            trips.append(1e3 * (time.perf_counter() - started))
            await asyncio.sleep(pause_s)
        return trips
    finally:
        worker.kill()
        worker.join()
        publisher.close()
        puller.close()
        context.term()


async def wait_for_subscription(publisher: LoopPlanPublisher, inbox: asyncio.Queue[Any]) -> None:
    """PUB drops what is sent before a subscriber has joined: repeat a plan until answered,
    then drain the extra answers."""
    deadline = time.monotonic() + 120  # the worker imports torch
    while time.monotonic() < deadline:
        publisher.send(decode_plan(0, READY_STEP_ID))
        if await next_message(inbox, 0.05) is not None:
            while await next_message(inbox, 0.2) is not None:
                pass
            return
    raise RuntimeError("the echo worker never answered")


async def next_message(inbox: asyncio.Queue[Any], timeout_s: float) -> Any | None:
    try:
        return await asyncio.wait_for(inbox.get(), timeout_s)
    except TimeoutError:
        return None


def codec_ms(num_seqs: int, repeats: int = 50) -> float:
    """Encode + decode of one plan and its result, in this process."""
    plan = decode_plan(num_seqs, 0)
    started = time.perf_counter()
    for _ in range(repeats):
        decode(encode(plan))
        decode(encode(answer(plan)))
    return 1e3 * (time.perf_counter() - started) / repeats


def measure(transport: str, num_seqs: int, num_trips: int, pause_s: float) -> dict[str, Any]:
    trips = asyncio.run(round_trips(transport, num_seqs, num_trips, pause_s))
    ordered = sorted(trips)
    return {
        "transport": transport,
        "num_seqs": num_seqs,
        "round_trip_p50_ms": statistics.median(trips),
        "round_trip_p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        "codec_ms": codec_ms(num_seqs),
    }


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| transport | sequences in the plan | round trip p50 ms | p90 | encode + decode ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['transport']} | {r['num_seqs']} | {r['round_trip_p50_ms']:.3f} | "
            f"{r['round_trip_p90_ms']:.3f} | {r['codec_ms']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transport_rtt", description=__doc__)
    p.add_argument("--num-seqs", default="1,64,256")
    p.add_argument("--transports", default="ipc,tcp")
    p.add_argument("--num-trips", type=int, default=400)
    p.add_argument("--pause-ms", type=float, default=10.0, help="between round trips")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    rows = [
        measure(transport, n, args.num_trips, args.pause_ms / 1e3)
        for transport in args.transports.split(",")
        for n in ints(args.num_seqs)
    ]
    text = report(rows)
    print(text)
    if args.out:
        out = Path(args.out)
        result = {"machine": machine_info(), "args": vars(args), "rows": rows}
        write_json(result, out.with_suffix(".json"))
        out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
