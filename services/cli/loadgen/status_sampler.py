"""Samples the engines' KV usage and running-batch size over a benchmark run.

Two sources: the `EngineStatus` hashes in Redis (what the schedulers write every second), or a
gateway's Prometheus `/metrics` (vLLM's gauge names, so a vLLM server works too). Samples are
`(seconds since start, num_running, num_waiting, kv_usage)`, summed (KV: averaged) over
engines.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import EngineStatus, from_fields
from pagedserve.shared.tasks import cancel_and_wait


@dataclass(frozen=True)
class StatusSample:
    time_s: float
    num_running: int
    num_waiting: int
    kv_usage: float


def parse_prometheus_gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named metric's samples in a Prometheus text exposition."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


@dataclass
class StatusSampler:
    """Polls every `interval_s` until stopped; `samples` grows as it runs."""

    redis_url: str | None = None
    namespace: str = "pagedserve"
    metrics_url: str | None = None
    interval_s: float = 0.5
    samples: list[StatusSample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _start: float = 0.0

    async def _read_redis(self, client: object) -> StatusSample | None:
        keys = RedisKeys(self.namespace)
        engine_ids = await client.smembers(keys.engines)  # type: ignore[attr-defined]
        statuses = []
        for engine_id in engine_ids:
            name = engine_id.decode() if isinstance(engine_id, bytes) else engine_id
            fields = await client.hgetall(keys.engine(name))  # type: ignore[attr-defined]
            if fields:
                statuses.append(from_fields(EngineStatus, fields))
        if not statuses:
            return None
        return StatusSample(
            time.perf_counter() - self._start,
            sum(s.num_running for s in statuses),
            sum(s.num_waiting for s in statuses),
            sum(s.kv_usage for s in statuses) / len(statuses),
        )

    async def _read_metrics(self, client: httpx.AsyncClient) -> StatusSample | None:
        names = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # fmt: skip
        response = await client.get(self.metrics_url)  # type: ignore[arg-type]
        if response.status_code != 200:
            return None
        values = parse_prometheus_gauges(response.text, names)
        kv = values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc", 0.0))
        return StatusSample(
            time.perf_counter() - self._start,
            int(values.get("vllm:num_requests_running", 0)),
            int(values.get("vllm:num_requests_waiting", 0)),
            kv,
        )

    async def _run(self) -> None:
        if self.redis_url:
            from pagedserve.shared.redis_client import RedisTarget, async_redis

            client: object = async_redis(RedisTarget(self.redis_url))
            read = self._read_redis
        else:
            client = httpx.AsyncClient(timeout=5.0)
            read = self._read_metrics  # type: ignore[assignment]
        try:
            while True:
                try:
                    sample = await read(client)  # type: ignore[arg-type]
                except Exception:  # a missed sample must not end the benchmark
                    sample = None
                if sample is not None:
                    self.samples.append(sample)
                await asyncio.sleep(self.interval_s)
        finally:
            await client.aclose()  # type: ignore[attr-defined]

    def start(self, start_time: float) -> None:
        if not (self.redis_url or self.metrics_url):
            return
        self._start = start_time
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> list[StatusSample]:
        if self._task is not None:
            await cancel_and_wait([self._task])
        return self.samples
