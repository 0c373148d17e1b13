"""`transformers serve --continuous-batching` as a benchmark baseline: started, warmed and
stopped here, spoken to by the same streaming client as pagedserve.

It is what a CPU user would deploy instead of us (paged KV cache, continuous batching,
OpenAI-compatible `/v1/completions`). Three differences from our API are bridged here:
- it has no `ignore_eos`: a request field `generation_config` (a JSON string) with
  `eos_token_id: -1` makes every output exactly `max_tokens` long;
- it rejects fields it does not know (HTTP 422), so `ignore_eos` and `min_tokens` are not sent;
- it takes its sampling settings from the first request it serves (its continuous-batching
  manager is built then), so it must be warmed up with the measured requests' fields, which
  `TransformersServeEndpoint` always sends.
It ends a stream without `data: [DONE]`; the client reads to the end of the body either way.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peer_server import PeerServer
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import BenchRequest
from pagedserve.services.cli.supervisor import ChildSpec

# Greedy with no end-of-sequence token: outputs are exactly `max_tokens` long.
EXACT_LENGTH_GENERATION_CONFIG = json.dumps({"do_sample": False, "eos_token_id": -1})


@dataclass(frozen=True)
class TransformersServeEndpoint(EndpointConfig):
    """The request body `transformers serve` accepts for a greedy fixed-length completion."""

    ignore_eos: bool = False  # it has no such field; `generation_config` does the job

    def body(self, request: BenchRequest) -> dict[str, Any]:
        body = super().body(request)
        body.pop("stream_options", None)  # ignored with a warning; usage is always sent
        body["generation_config"] = EXACT_LENGTH_GENERATION_CONFIG
        return body


@dataclass(frozen=True)
class TransformersServeConfig:
    """The flags the baseline runs with (issue 18: the run pagedserve is compared against)."""

    model_dir: Path
    dtype: str = "float32"  # float32 | bfloat16
    block_size: int = 32
    num_blocks: int = 1536
    max_batch_tokens: int = 512
    threads: int | None = None  # OMP threads; None: torch's default (every core)
    startup_timeout_s: float = 300.0


def transformers_serve_argv(config: TransformersServeConfig, port: int) -> list[str]:
    """The command line of the server, run with this interpreter's transformers."""
    # `transformers serve` is a typer app; `python -m transformers.cli.transformers` is its
    # entry point without relying on the console script being on PATH. `-P`: the working
    # directory stays off sys.path, so our checkout's `kernels/` folder does not stand in for
    # Hugging Face's `kernels` package, which transformers' serve imports (5.25 on).
    return [
        sys.executable, "-P", "-m", "transformers.cli.transformers", "serve", str(config.model_dir),
        "--continuous-batching", "--device", "cpu", "--dtype", config.dtype,
        "--cb-block-size", str(config.block_size), "--cb-num-blocks", str(config.num_blocks),
        "--cb-max-batch-tokens", str(config.max_batch_tokens),
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip


def transformers_serve_env(config: TransformersServeConfig) -> dict[str, str]:
    """Our environment (ISA caps such as ONEDNN_MAX_CPU_ISA included), offline, and the
    thread count when one is set."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if config.threads:
        env["OMP_NUM_THREADS"] = str(config.threads)
    return env


class TransformersServer(PeerServer):
    """`with TransformersServer(config) as server:` -> `server.base_url`, `server.endpoint()`."""

    name = "transformers serve"

    def endpoint(self) -> TransformersServeEndpoint:
        # It serves the model under the name it was started with (other names: HTTP 400).
        return TransformersServeEndpoint(self.base_url, str(self.config.model_dir))

    def child_spec(self) -> ChildSpec:
        argv = transformers_serve_argv(self.config, self.port)
        return ChildSpec("transformers-serve", argv, env=transformers_serve_env(self.config))
