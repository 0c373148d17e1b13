"""Typed configuration shared by every service. Frozen dataclasses; addresses as properties.

Every field can come from the command line (flags named as vLLM names them where the meaning
is the same) or from a `PAGEDSERVE_*` environment variable; see `env_default`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_MODEL = "smollm2"
DEFAULT_NAMESPACE = "pagedserve"


def env_default(name: str, default: str) -> str:
    """The value of `PAGEDSERVE_<NAME>` if set, else `default`."""
    return os.environ.get(f"PAGEDSERVE_{name.upper()}", default)


def default_block_size(device_type: str) -> int:
    """The KV block size (tokens per page) a worker on `device_type` uses when none is given.

    8 on the CPU: the torch attention backend gathers KV per slot, so a smaller page costs
    nothing and halves the waste in each sequence's last, partly filled block (on our benchmark
    workload's peak 96.3% of KV slots hold real tokens at 8, 92.2% at 16). 16 elsewhere: the Triton
    kernels are tuned and tested at 16, vLLM's default.
    """
    return 8 if device_type == "cpu" else 16


def default_max_num_batched_tokens(device_type: str) -> int:
    """The per-step token budget a worker on `device_type` asks for when none is given.

    512 on the CPU: a step carrying a long prefill chunk stalls every running decode for as long
    as the chunk takes. Measured in-process (192-request long-tailed workload, 1 thread, bf16,
    max_num_seqs 128): 2048 gives 169.1 output tok/s with a 3002 ms step p99, 1024 176.9 tok/s
    and 1611 ms, 512 175.4 tok/s and 863 ms, 256 166.1 tok/s and 548 ms; 512 keeps the
    throughput and cuts the worst inter-token gap ~3.5x. (The CPU platform asks for 1024 where
    its fused bf16 forward takes such steps: `FUSED_STEP_TOKENS` in `platforms/cpu.py`.) 2048
    elsewhere: vLLM's default for online serving with chunked prefill; GPU prefill is cheap
    per token.
    """
    return 512 if device_type == "cpu" else 2048


def default_num_speculative_tokens(device_type: str) -> int:
    """The n-gram drafts (`SchedulerConfig.num_speculative_tokens`) a worker on `device_type`
    has the scheduler use when none is given: 3 on the CPU, 0 (off, as in vLLM) elsewhere.

    On a CPU a decode step of few sequences is bound by reading the weights, so the rows drafts
    add there are cheap, and the scheduler drafts only there (steps of at most
    `speculative_max_num_seqs` sequences, nothing waiting, no request finished since the last
    plan) and only for greedy free text: the output is the same, in fewer steps where the text
    repeats. Through `pagedserve serve` (bf16, 2 threads, the vs_vllm workload of 96 greedy
    requests, alternated rounds): 1.16x output tok/s at 16 in flight and 1.02x at 64 against
    off, then 1.04x / 1.14x more from the after-finish rule. Never measured on a GPU, where it
    stays off.
    """
    return 3 if device_type == "cpu" else 0


@dataclass(frozen=True)
class CacheConfig:
    block_size: int | None = None  # None: the workers' device default (`default_block_size`)
    num_blocks: int | None = None  # None: decided by the workers from the memory below
    kv_cache_memory: int | None = None  # bytes of KV cache per rank (CPU); None: a default
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory for weights + activations + KV
    enable_prefix_caching: bool = True
    # tokens the widest layer's window spans when every layer attends within one (the workers
    # report it); blocks before a request's window are given back. None: full attention
    sliding_window: int | None = None
    # --kv-cache-metrics: the fraction of blocks followed for residency metrics; 0.0: off
    kv_cache_metrics_sample: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.kv_cache_metrics_sample <= 1:
            raise ValueError(
                f"kv_cache_metrics_sample must be in [0, 1], got {self.kv_cache_metrics_sample}"
            )
        if self.block_size is not None and (
            self.block_size < 1 or self.block_size & (self.block_size - 1)
        ):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


# Draft tokens per sequence and step, at most: with the token they follow, a sequence's step
# stays within the CPU attention kernel's short-query path (16 new tokens, SHORT_QUERY_LEN).
MAX_SPECULATIVE_TOKENS = 15
# drafts only in steps of at most this many sequences (see services/scheduler/speculation.py)
DEFAULT_SPECULATIVE_MAX_NUM_SEQS = 32


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # sequences running at once
    # tokens computed in one step; None: the workers' device default
    # (`default_max_num_batched_tokens`)
    max_num_batched_tokens: int | None = None
    max_model_len: int = 2048  # prompt + output tokens of one sequence
    max_waiting: int = 4096  # waiting requests beyond which new ones are refused
    policy: str = "fcfs"  # "fcfs" | "priority"
    enable_chunked_prefill: bool = True
    # n-gram speculative decoding (prompt lookup, `services/scheduler/speculation.py`): draft
    # tokens a greedy sequence may have checked in one step; 0: off; None: the workers' device
    # default (`default_num_speculative_tokens`)
    num_speculative_tokens: int | None = None
    # ... only in steps that run at most this many sequences: beyond, the rows drafts add cost
    # more than the steps they save (every row is a full pass through the weights on a CPU)
    speculative_max_num_seqs: int = DEFAULT_SPECULATIVE_MAX_NUM_SEQS
    # plan step N+1 while step N computes (vLLM's async scheduling): the worker keeps its own
    # samples, and a decoding sequence is planned on a token still being sampled
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if (
            self.num_speculative_tokens is not None
            and not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS
        ):
            raise ValueError(
                f"num_speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}], "
                f"got {self.num_speculative_tokens}"
            )
        if self.speculative_max_num_seqs < 1:
            raise ValueError(
                f"speculative_max_num_seqs must be >= 1, got {self.speculative_max_num_seqs}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_waiting"):
            value = getattr(self, name)
            if not (value is None and name == "max_num_batched_tokens") and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})"
            )


@dataclass(frozen=True)
class ModelConfig:
    model: str = DEFAULT_MODEL  # an alias ("smollm2") or a Hugging Face model directory
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16"
    max_model_len: int | None = None  # None: the model's own limit
    served_model_name: str | None = None  # the name clients use; None: `model`
    seed: int = 0


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    master_addr: str = "127.0.0.1"  # torch.distributed rendezvous between worker ranks
    master_port: int = 29555

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")


@dataclass(frozen=True)
class RedisConfig:
    url: str = "redis://127.0.0.1:6379/0"
    namespace: str = DEFAULT_NAMESPACE


@dataclass(frozen=True)
class EngineAddressConfig:
    """Where one engine's scheduler and its workers meet (ZeroMQ)."""

    host: str = "127.0.0.1"
    plan_port: int = 5555  # scheduler PUB -> workers SUB
    result_port: int = 5556  # workers PUSH -> scheduler PULL

    @property
    def plan_bind(self) -> str:
        return f"tcp://{self.host}:{self.plan_port}"

    @property
    def result_bind(self) -> str:
        return f"tcp://{self.host}:{self.result_port}"

    def plan_connect(self, host: str | None = None) -> str:
        return f"tcp://{host or self.host}:{self.plan_port}"

    def result_connect(self, host: str | None = None) -> str:
        return f"tcp://{host or self.host}:{self.result_port}"
