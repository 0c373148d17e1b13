"""The CPU platform: bf16 only where matmuls are native bf16, 8-token blocks, a thread count
chosen from the idle cores, linears packed once at load (`cpu_prepack.py`), the fused bf16
forward pass where it applies (`cpu_fused_forward.py`), and a KV cache of a memory budget."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pagedserve.kernels import cpu_paged_attention
from pagedserve.services.gpu_worker.cpu_cache_sizes import l2_bytes_per_core
from pagedserve.services.gpu_worker.cpu_threads import cpu_threads, most_threads
from pagedserve.services.gpu_worker.kv_cache import DEFAULT_CPU_KV_CACHE_BYTES, num_blocks_for_bytes
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.services.gpu_worker.platforms.base import BasePlatform, ForwardPass, KVSizing
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward
from pagedserve.services.gpu_worker.platforms.cpu_prepack import prepack_linears

# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below which it has no native bf16 matmul
_ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                             "AVX512_CORE_VNNI")  # fmt: skip

# The step token budget where the fused forward takes steps that big (bf16 without AMX): a
# prompt token costs less there in 1024-token steps than in 512 (581 against 596 us,
# `benchmarks/prefill_budget.py`), and a burst of prompts carries its running decodes through
# half as many steps. Through `pagedserve serve`, 2 alternated rounds
# (`benchmarks/results/budget1024_fused_serve_ab_avx512bf16_2026-12-05.md`): at 64 in flight
# TTFT p99 3648 against 3893 ms, p50 747 against 1105, 1.02x output tok/s, TPOT p99 343
# against 323; at 16 in flight TTFT p99 667 against 753; 3 more rounds at 64 in flight
# (`..._default_serve_ab_64_avx512bf16_2026-12-05.md`): TTFT p99 3557-3702 against 3804-4076,
# TPOT p99 337-342 against 305-327. Elsewhere the device default, 512: AMX's pass takes 128
# rows, and the modules (float32 on Intel, MKL's packing) were never measured at more.
FUSED_STEP_TOKENS = 1024

# The step token budget where the fused float32 pass takes prompt steps (its attention kernel
# takes prompts on float32 lanes). Through `pagedserve serve`, AVX2 caps, 2 threads, against
# 512, two runs of 2 alternated rounds (`benchmarks/results/budget768_fp32_serve_ab_avx2_
# 2026-12-06.md` and `..._again.md`): at 64 in flight TTFT p99 6808-6972 against 7482-7983 ms,
# TPOT p99 632-636 against 613-630, 1.016x / 1.066x output tok/s; at 16 in flight 1.067x /
# 1.014x, TTFT p99 1266-1483 against 1243-1334. 1024 against 768 (`budget1024_vs_768_...`):
# 0.956x at 64 in flight, TTFT p99 the same (6811 against 6723). (Before the lanes, with
# prompts through SDPA, 1024 had cut TTFT p99 at 64 in flight, 7711 against 8486 ms, but raised
# TPOT p99, 1132 against 706: `budget1024_fp32_serve_ab_avx2_2026-12-05.md`.)
FUSED_FP32_STEP_TOKENS = 768

# The same pass where a core has less than 1 MiB of L2. On a 2-core AMD EPYC Zen 3 (AVX2, 512
# KiB of L2 a core; the Zen 4 above has 1 MiB), 512 against 768 through the service, 2
# alternated rounds (`benchmarks/results/budget512_vs_768_fp32_serve_ab_zen3_avx2_2026-12-06.md`):
# at 64 in flight 1.075x output tok/s (by round 1.085 / 1.064), TPOT p99 852 against 952 ms,
# TTFT p50 2896 against 2968, p99 10739 against 10348; at 16 in flight 1.012x; against vLLM
# 1.37x at 64 in flight with 768, 1.55x and 1.51x with 512 (README). In-process the prompts
# alone cost no clearer a difference (`benchmarks/prefill_budget.py`: 1588 against 1712 us a
# token, then 1516 / 1562, then 1729 / 1604: the box's spread), so the gain is likely in how
# shorter steps mix with the decodes; why the Zen 4's 768 does not hold here is not known.
SMALL_L2_FP32_STEP_TOKENS = 512
SMALL_L2_BYTES = 1 << 20  # below this much L2 a core: the smaller budget, decodes by sequence


def small_l2(l2_bytes: int | None) -> bool:
    """A core with less than SMALL_L2_BYTES of L2 (the Zen 3's 512 KiB); unknown (None) counts
    as large, as the Zen 4's 1 MiB, where the defaults were first measured."""
    return l2_bytes is not None and l2_bytes < SMALL_L2_BYTES


def fused_fp32_step_tokens(l2_bytes: int | None) -> int:
    """The float32 pass's step budget for a core with `l2_bytes` of L2 (None: unknown)."""
    return SMALL_L2_FP32_STEP_TOKENS if small_l2(l2_bytes) else FUSED_FP32_STEP_TOKENS


def single_decodes_by_sequence(l2_bytes: int | None) -> bool:
    """Whether the CPU attention kernel takes float32 single-token decodes by sequence: where a
    core has less than 1 MiB of L2 (None: unknown, as the Zen 4's). By pair the kernel fetches
    the next sequence's rows whole into L2 (512 KiB at most), which a 1 MiB L2 holds: on a
    2-core Zen 4 by sequence took 1.26-1.36x as long a call at 64 sequences of ~300 tokens, on
    a Zen 3 (512 KiB) 0.72-0.76x (`python -m benchmarks.cpu_attention_ab`; the C source)."""
    return small_l2(l2_bytes)


def cpu_supports_bf16() -> bool:
    """Native bf16 matmuls: the CPU has them, and neither torch's kernel capability
    (ATEN_CPU_CAPABILITY) nor oneDNN's (ONEDNN_MAX_CPU_ISA) is capped below AVX-512, as they
    are to run as an AVX2-only machine would (where bf16 is emulated and slower than fp32)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in _ONEDNN_ISAS_WITHOUT_BF16:
        return False
    if not str(torch.backends.cpu.get_cpu_capability()).upper().startswith("AVX512"):
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class CpuPlatform(BasePlatform):
    device_type = "cpu"
    default_attention_backend = "torch"

    def set_up_process(self, rank: int, world_size: int) -> None:
        torch.set_num_threads(cpu_threads(world_size))
        cpu_paged_attention.set_single_decodes_by_sequence(
            single_decodes_by_sequence(l2_bytes_per_core())
        )

    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16 if cpu_supports_bf16() else torch.float32

    def prepare_model(self, model: BaseCausalLM, world_size: int) -> None:
        # packed on the most threads the worker will run with (see cpu_prepack)
        prepack_linears(model, most_threads(self.device, world_size))

    def forward_pass(self, model: BaseCausalLM) -> ForwardPass:
        fused = CpuFusedForward.build(model)
        return model if fused is None else fused

    def default_max_num_batched_tokens(self, forward_pass: ForwardPass) -> int:
        if isinstance(forward_pass, CpuFusedForward):
            if forward_pass.dtype == torch.bfloat16 and forward_pass.takes(FUSED_STEP_TOKENS):
                return FUSED_STEP_TOKENS
            if forward_pass.dtype == torch.float32 and forward_pass.takes_prompts():
                return fused_fp32_step_tokens(l2_bytes_per_core())
        return super().default_max_num_batched_tokens(forward_pass)

    def num_kv_blocks(self, sizing: KVSizing) -> int:
        budget = sizing.cache_config.kv_cache_memory or DEFAULT_CPU_KV_CACHE_BYTES
        return num_blocks_for_bytes(budget, sizing.layout.block_bytes())
