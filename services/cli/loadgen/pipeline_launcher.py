"""Start the whole serving pipeline (Redis, scheduler, one worker, gateway) as subprocesses on
loopback with free ports, for benchmarks and their tests; stopped (process groups killed) on
exit. The same processes `pagedserve serve` runs, started one by one so that each one's flags
are explicit here."""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import RedisServer
from pagedserve.services.cli.supervisor import ChildSpec, Supervisor
from pagedserve.shared.config import DEFAULT_SPECULATIVE_MAX_NUM_SEQS
from pagedserve.shared.options import option_argv


@dataclass(frozen=True)
class PipelineConfig:
    model_dir: Path
    dtype: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: the worker's device default
    max_model_len: int | None = None
    num_blocks: int | None = None
    worker_threads: int | None = None  # OMP threads of the worker; None: torch's default
    num_speculative_tokens: int | None = None  # n-gram speculative decoding; 0: off; None: device's
    speculative_max_num_seqs: int = DEFAULT_SPECULATIVE_MAX_NUM_SEQS
    async_scheduling: bool = False  # plan each step while the last one computes
    startup_timeout_s: float = 180.0


class LocalPipeline:
    """`with LocalPipeline(config) as p:` -> `p.base_url`, `p.redis_url`, `p.namespace`."""

    def __init__(self, config: PipelineConfig, log: TextIO | None = None) -> None:
        self.config = config
        self.namespace = f"bench-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.redis = RedisServer(free_port())
        self.supervisor = Supervisor(out=log or sys.stderr)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def _specs(self) -> list[ChildSpec]:
        c = self.config
        plan_port, result_port = free_port(), free_port()
        engine = {"plan_port": plan_port, "result_port": result_port,
                  "max_num_batched_tokens": c.max_num_batched_tokens,
                  "max_model_len": c.max_model_len}  # fmt: skip
        scheduler = _python("pagedserve.services.scheduler", {
            "redis_url": self.redis_url, "namespace": self.namespace,
            "engine_id": f"{self.namespace}-engine", "max_num_seqs": c.max_num_seqs, **engine,
            "num_speculative_tokens": c.num_speculative_tokens,
            "speculative_max_num_seqs": c.speculative_max_num_seqs,
            "async_scheduling": c.async_scheduling,
        })  # fmt: skip
        worker = _python("pagedserve.services.gpu_worker", {
            "model": c.model_dir, "device": "cpu", "dtype": c.dtype, "num_blocks": c.num_blocks,
            **engine,
        })  # fmt: skip
        gateway = _python("pagedserve.services.gateway", {
            "model": c.model_dir, "redis_url": self.redis_url, "namespace": self.namespace,
            "port": self.port, "gateway_id": f"{self.namespace}-gw",
            "max_model_len": c.max_model_len,
        })  # fmt: skip
        worker_env = dict(os.environ)
        if c.worker_threads:
            worker_env["PAGEDSERVE_NUM_THREADS"] = str(c.worker_threads)
            worker_env["OMP_NUM_THREADS"] = str(c.worker_threads)
        return [
            ChildSpec("scheduler", scheduler),
            ChildSpec("worker", worker, env=worker_env),
            ChildSpec("gateway", gateway),
        ]

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> LocalPipeline:
        self.redis.start()
        try:
            for spec in self._specs():
                self.supervisor.start(spec)
            self.supervisor.wait_until(
                "the gateway's /health reporting a live engine",
                self._healthy,
                self.config.startup_timeout_s,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.supervisor.stop(list(reversed(self.supervisor.children)), timeout_s=10.0)
        self.redis.stop()

    def __enter__(self) -> LocalPipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _python(module: str, values: dict[str, object]) -> list[str]:
    return [sys.executable, "-P", "-m", module, *option_argv(values)]
