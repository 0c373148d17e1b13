"""Every command-line flag of pagedserve, declared once.

`OPTIONS` is the one table: each `Option` knows its flag, type, default and help. From it come
every argparse parser (`add_options`), every `PAGEDSERVE_<DEST>` environment variable (the
default when the flag is absent; an empty variable counts as unset) and every child command
line that `pagedserve serve` builds (`option_argv`). A new flag is one line here plus its name
in the parsers that take it. A parser may adjust an option for its own use (another default,
help or choices) with `use(name, ...)`; the flag and its variable stay the same.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pagedserve.shared.config import (
    DEFAULT_MODEL,
    DEFAULT_NAMESPACE,
    DEFAULT_SPECULATIVE_MAX_NUM_SEQS,
)
from pagedserve.shared.status import FINISHED_REQUEST_STATUS_TTL_S

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def optional_int(text: str) -> int | None:
    """An int, or None for "" / "none" (an optional flag's "not given")."""
    return None if text.strip().lower() in ("", "none") else int(text)


@dataclass(frozen=True)
class Option:
    flag: str  # "--max-num-seqs"
    default: Any = None
    type: Callable[[str], Any] = str
    help: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # takes no value; giving the flag sets `not default`
    dest_name: str | None = None  # default: the flag, dashes as underscores
    aliases: tuple[str, ...] = ()  # short forms ("-tp")
    env_aliases: tuple[str, ...] = ()  # read before PAGEDSERVE_<DEST> ("REDIS_URL")

    @property
    def dest(self) -> str:
        return self.dest_name or self.flag.lstrip("-").replace("-", "_")

    @property
    def env_names(self) -> tuple[str, ...]:
        return (*self.env_aliases, f"PAGEDSERVE_{self.dest.upper()}")

    def env_value(self) -> str | None:
        """The first non-empty variable of `env_names`, or None."""
        return next((os.environ[n] for n in self.env_names if os.environ.get(n)), None)

    def default_now(self) -> Any:
        """The default under the current environment (a string is parsed by argparse)."""
        raw = self.env_value()
        if raw is None:
            return self.default
        if not self.switch:
            return raw
        if raw.strip().lower() in _TRUE:
            return True
        return False if raw.strip().lower() in _FALSE else self.default

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        names = (self.flag, *self.aliases)
        if self.switch:
            action = "store_false" if self.default else "store_true"
            parser.add_argument(
                *names, dest=self.dest, action=action, default=self.default_now(), help=self.help
            )
            return
        parser.add_argument(
            *names,
            dest=self.dest,
            type=self.type,
            default=self.default_now(),
            choices=self.choices,
            help=self.help,
        )

    def to_argv(self, value: Any) -> list[str]:
        """This option on a child's command line; nothing for None or an unset switch."""
        if value is None:
            return []
        if self.switch:
            return [self.flag] if bool(value) != bool(self.default) else []
        return [self.flag, str(value)]


_DTYPES = ("auto", "float32", "bfloat16", "float16")
_LOOPBACK = "127.0.0.1"
_LOCAL_REDIS = "redis://127.0.0.1:6379/0"

OPTIONS: dict[str, Option] = {
    o.dest: o
    for o in (
        # the model
        Option("--model", DEFAULT_MODEL, help="'smollm2' (default) or a HF model directory"),
        Option("--served-model-name", help="the name clients use; default: --model"),
        Option("--dtype", "auto", choices=_DTYPES),
        Option("--max-model-len", None, optional_int, help="default: the model's"),
        # the engine
        Option("--tensor-parallel-size", 1, int, aliases=("-tp",)),
        Option("--max-num-seqs", 256, int, help="sequences running at once"),
        Option("--max-num-batched-tokens", None, optional_int,
               help="tokens computed in one step; default: 512 on CPU (1024 in bf16 without AMX, "
                    "768 in float32 where the fused pass takes prompts), 2048 on CUDA"),
        Option("--block-size", None, optional_int,
               help="KV tokens per block; default: 8 on CPU, 16 on CUDA"),
        Option("--num-blocks", None, optional_int, help="KV blocks; default: from memory"),
        Option("--kv-cache-memory", None, optional_int,
               help="KV cache bytes per rank (CPU); default: the worker's"),
        Option("--gpu-memory-utilization", 0.9, float),
        Option("--max-waiting", 4096, int, help="waiting requests beyond which new are refused"),
        Option("--policy", "fcfs", choices=("fcfs", "priority")),
        Option("--num-speculative-tokens", None, optional_int,
               help="n-gram speculative decoding: draft tokens a greedy sequence may have "
                    "checked per step (prompt lookup; output unchanged); 0: off; default: 3 "
                    "on CPU, 0 on CUDA"),
        Option("--speculative-max-num-seqs", DEFAULT_SPECULATIVE_MAX_NUM_SEQS, int,
               help="draft only in steps that run at most this many sequences"),
        Option("--async-scheduling", False, switch=True,
               help="plan each step while the last one computes (vLLM's); one rank only"),
        Option("--scheduling-policy", "fcfs", choices=("fcfs", "priority")),
        Option("--no-prefix-caching", False, switch=True),
        Option("--kv-cache-metrics", False, switch=True,
               help="KV block residency histograms in /metrics (vLLM's vllm:kv_block_*)"),
        Option("--kv-cache-metrics-sample", 0.01, float,
               help="with --kv-cache-metrics: the fraction of blocks followed"),
        Option("--no-enable-prefix-caching", True, switch=True, dest_name="enable_prefix_caching"),
        Option("--worker-timeout", 10.0, float,
               help="seconds without a worker's heartbeat before it counts as lost"),
        Option("--step-timeout", 60.0, float,
               help="seconds a step's result may take (a worker that heartbeats is alive)"),
        Option("--drain-timeout", 5.0, float),
        Option("--worker-recovery-timeout", 60.0, float,
               help="seconds without workers after which unfinished requests are failed"),
        Option("--finished-request-ttl", FINISHED_REQUEST_STATUS_TTL_S, int,
               help="seconds a finished request's status record stays in Redis "
                    "(`pagedserve queue show ID`)"),
        # the worker
        Option("--rank", 0, int),
        Option("--device", "auto", choices=("auto", "cpu", "cuda")),
        Option("--attention-backend", "auto", choices=("auto", "torch", "triton")),
        Option("--scheduler-timeout", 10.0, float,
               help="seconds without a scheduler heartbeat before dropping state and re-attaching"),
        Option("--master-addr", _LOOPBACK),
        Option("--master-port", 29555, int),
        # where the processes meet
        Option("--redis-url", _LOCAL_REDIS),
        Option("--redis-sentinel", None,
               help="HOST:PORT[,HOST:PORT...]/SERVICE: reach the primary of SERVICE through "
                    "these Redis Sentinels (--redis-url then gives only the db and password)"),
        Option("--namespace", DEFAULT_NAMESPACE, help="prefix of every Redis key"),
        Option("--engine-id", None),
        Option("--gateway-id", "", help="default: random"),
        Option("--host", _LOOPBACK, help="bind address (loopback)"),
        Option("--port", 8000, int),
        Option("--scheduler-host", _LOOPBACK),
        Option("--plan-port", 5555, int),
        Option("--result-port", 5556, int),
        Option("--plan-address", None, help="ZeroMQ plan endpoint (tcp:// or ipc://); "
               "default: tcp:// on the host and --plan-port"),
        Option("--result-address", None, help="ZeroMQ result endpoint (tcp:// or ipc://); "
               "default: tcp:// on the host and --result-port"),
        # the gateway
        Option("--api-key", None, help="require `Authorization: Bearer KEY`"),
        Option("--metrics-require-key", False, switch=True,
               help="ask for the API key on /metrics too (open by default)"),
        Option("--max-pending-requests", 4096, int),
        Option("--routing", "cache", choices=("cache", "load", "shared"),
               help="where a request goes: 'cache' the engine holding the longest cached "
                    "prefix of its prompt (among those not overloaded), 'load' the least-loaded "
                    "engine, 'shared' a shared queue any engine takes from"),
        Option("--shutdown-timeout", 30.0, float,
               help="on SIGTERM: seconds open requests may take before they are aborted"),
        Option("--engine-loss-timeout", 30.0, float,
               help="seconds without any live engine after which open requests fail with a 503"),
        Option("--max-body-bytes", 8 * 1024 * 1024, int,
               help="request bodies over this many bytes get a 413"),
        Option("--header-timeout", 10.0, float,
               help="seconds a request's headers may take to arrive (slow clients get a 408)"),
        Option("--body-timeout", 30.0, float,
               help="seconds a request's body may take to arrive after its headers"),
        Option("--max-seqs-per-request", 256, int,
               help="most sequences (prompts x n) one request may ask for"),
        Option("--max-requests-per-client", 1024, int,
               help="open API requests per API key (else per address) before a 429; 0: no bound"),
        Option("--tokenizer-threads", 2, int,
               help="prompts tokenized at once; the others wait their turn"),
        Option("--chat-template", None,
               help="a Jinja chat template (a file, or the template itself) instead of the "
                    "model's, e.g. one that renders `tools`"),
        Option("--enable-auto-tool-choice", False, switch=True,
               help="let the model call tools by itself (tool_choice 'auto'); needs "
                    "--tool-call-parser and a chat template that renders `tools`"),
        Option("--trust-request-chat-template", False, switch=True,
               help="accept a request's own `chat_template` (refused with a 400 otherwise)"),
        Option("--tool-call-parser", None, choices=("hermes",),
               help="how tool calls are read from the output: 'hermes' "
                    "(<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>)"),
        # serve
        Option("--num-gateways", 1, int, help="replicas on PORT, PORT+1, ..."),
        Option("--startup-timeout", 600.0, float,
               help="seconds to wait for every process to be ready"),
    )
}  # fmt: skip


def use(name: str, **changes: Any) -> Option:
    """The table's option `name`, adjusted for one parser (default, help, choices...)."""
    return replace(OPTIONS[name], **changes)


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *options: str | Option
) -> None:
    """Add each option (a table name, or an adjusted `use(...)`) to `parser`."""
    for option in options:
        (OPTIONS[option] if isinstance(option, str) else option).add_to(parser)


def option_argv(values: Mapping[str, Any]) -> list[str]:
    """A child's command line from {dest: value}, in the table's spelling of each flag."""
    argv: list[str] = []
    for dest, value in values.items():
        argv += OPTIONS[dest].to_argv(value)
    return argv


# ---------------------------------------------------------------------------------------------
# Environment switches: variables without a flag that turn a CPU fast path off, for A/B
# measurements and as an escape hatch. Each is on unless set to 0, false, no or off.


@dataclass(frozen=True)
class Switch:
    variable: str  # "PAGEDSERVE_CPU_ARGMAX_KERNEL"
    help: str

    def is_on(self) -> bool:
        return os.environ.get(self.variable, "").strip().lower() not in _FALSE


CPU_SWITCHES: dict[str, Switch] = {
    s.variable: s
    for s in (
        Switch("PAGEDSERVE_CPU_ARGMAX_KERNEL", "the sampler's greedy argmax in C (cpu_argmax.c)"),
        Switch("PAGEDSERVE_CPU_ATTENTION_KERNEL",
               "paged attention in C in one pass over the cache (cpu_paged_attention.c)"),
        Switch("PAGEDSERVE_CPU_KV_WRITE_KERNEL", "KV cache writes in C (cpu_kv_write.c)"),
        Switch("PAGEDSERVE_CPU_NORM_KERNEL", "RMSNorm with its residual add in C (cpu_rms_norm.c)"),
        Switch("PAGEDSERVE_CPU_ROTARY_KERNEL", "rotary embedding in C (cpu_rotary.c)"),
        Switch("PAGEDSERVE_CPU_SGEMM_KERNEL",
               "float32 linears of a few dozen rows in C, AVX2/FMA (cpu_small_sgemm.c)"),
        Switch("PAGEDSERVE_CPU_GEMM_KERNEL",
               "bf16 linears of few rows in C, AVX512-BF16 (cpu_small_gemm.c)"),
        Switch("PAGEDSERVE_CPU_GEMM_AMX",
               "the AMX tiles in the bf16 linears, where the CPU has them"),
        Switch("PAGEDSERVE_CPU_HUGE_PAGES",
               "packed weights and the KV cache in transparent huge pages (cpu_huge_pages.py)"),
        Switch("PAGEDSERVE_CPU_FUSED_FORWARD",
               "the whole bf16 Llama forward through the C kernels (models/cpu_fused_forward.py)"),
    )
}  # fmt: skip


def switch_on(variable: str) -> bool:
    """Whether the environment leaves the switch `variable` on; KeyError for a variable not
    declared in `CPU_SWITCHES` (so a misspelt name fails at once, not silently on)."""
    return CPU_SWITCHES[variable].is_on()
