"""vLLM's CPU build as a benchmark peer: started from its own virtual environment (it pins
its own torch, so it cannot share ours), warmed and stopped here, spoken to by the same
streaming client as pagedserve.

Its OpenAI server takes `ignore_eos` and `min_tokens`, so the client's default request body
gives exact output lengths as with us. Its CPU backend binds its OpenMP threads to the cores
named in `VLLM_CPU_OMP_THREADS_BIND` and reserves `VLLM_CPU_KVCACHE_SPACE` GiB of KV cache;
its first start compiles kernels for minutes (later starts reuse the compile cache).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peer_server import PeerServer
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.supervisor import ChildSpec
from pagedserve.services.scheduler.ngram_proposer import MAX_N, MIN_N

VLLM_PYTHON_ENV = "VLLM_PYTHON"  # the suite's way to name the peer's interpreter


@dataclass(frozen=True)
class VllmServeConfig:
    python: Path  # the interpreter of the venv vLLM's CPU build is installed in
    model_dir: Path
    dtype: str = "float32"  # float32 | bfloat16
    threads: int | None = None  # cores 0..threads-1; None: every core of this process
    kv_cache_gib: int = 3
    max_num_seqs: int = 256
    startup_timeout_s: float = 1200.0  # the first start compiles for minutes
    num_speculative_tokens: int | None = None  # n-gram speculation (prompt lookup); 0/None: off
    extra_args: tuple[str, ...] = ()  # more `vllm serve` flags, e.g. ("--block-size", "16")


def omp_bind(threads: int | None) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `threads` threads: the first cores we may run on."""
    cores = sorted(os.sched_getaffinity(0))
    count = threads or len(cores)
    if not 1 <= count <= len(cores):
        raise ValueError(f"threads must be between 1 and {len(cores)}, got {threads}")
    chosen = cores[:count]
    if chosen == list(range(chosen[0], chosen[-1] + 1)):
        return f"{chosen[0]}-{chosen[-1]}"
    return ",".join(str(c) for c in chosen)


def vllm_serve_argv(config: VllmServeConfig, port: int) -> list[str]:
    return [
        str(config.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(config.model_dir), "--dtype", config.dtype,
        "--max-num-seqs", str(config.max_num_seqs),
        "--host", "127.0.0.1", "--port", str(port),
        *speculative_argv(config.num_speculative_tokens),
        *config.extra_args,
    ]  # fmt: skip


def speculative_argv(num_speculative_tokens: int | None) -> list[str]:
    """vLLM's n-gram speculation with our proposer's n-gram lengths (4 down to 2)."""
    if not num_speculative_tokens:
        return []
    config = {
        "method": "ngram",
        "num_speculative_tokens": num_speculative_tokens,
        "prompt_lookup_max": MAX_N,
        "prompt_lookup_min": MIN_N,
    }
    return ["--speculative-config", json.dumps(config)]


def vllm_serve_env(config: VllmServeConfig) -> dict[str, str]:
    """Our environment (ISA caps included: the peer's oneDNN and torch honour them too),
    offline, with vLLM's CPU settings."""
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE=str(config.kv_cache_gib),
        VLLM_CPU_OMP_THREADS_BIND=omp_bind(config.threads),
    )


PEER_PROBE = (
    "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, "
    "'torch': torch.__version__, 'torch_cpu_capability': "
    "str(torch.backends.cpu.get_cpu_capability())}))"
)


def peer_info(config: VllmServeConfig) -> dict[str, Any]:
    """The peer's versions and the ISA its torch runs at, asked of its own interpreter under
    the run's environment; the threads and dtype it is started with."""
    done = subprocess.run(
        [str(config.python), "-c", PEER_PROBE], env=vllm_serve_env(config),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{config.python} cannot import vllm: {done.stderr.strip()[-500:]}")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    info.update(
        threads=config.threads,
        omp_bind=omp_bind(config.threads),
        dtype=config.dtype,
        kv_cache_gib=config.kv_cache_gib,
        speculative_argv=speculative_argv(config.num_speculative_tokens),
        extra_args=list(config.extra_args),
    )
    return info


class VllmServer(PeerServer):
    """`with VllmServer(config) as server:` -> `server.endpoint()`."""

    name = "vLLM"
    stop_timeout_s = 20.0

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig(self.base_url, str(self.config.model_dir))

    def child_spec(self) -> ChildSpec:
        argv = vllm_serve_argv(self.config, self.port)
        return ChildSpec("vllm", argv, env=vllm_serve_env(self.config))
