"""The CPU forward pass as one loop of C calls in float32 (`cpu_fused_forward.py`): where the
float32 kernel holds the weights, the same bits as the module path for steps of decodes,
drafts and prompts (the attention kernel takes chunks of any length on its float32 lanes),
the modules for a step with a chunk the kernel leaves to SDPA (a head_dim its lanes do not
take), and the CPU's default budget, 768 tokens where the pass takes prompts (512 with less
than 1 MiB of L2 a core)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_paged_attention, cpu_small_sgemm
from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.cpu_cache_sizes import l2_bytes_per_core
from pagedserve.services.gpu_worker.platforms import cpu as cpu_platform
from pagedserve.services.gpu_worker.platforms import cpu_prepack
from pagedserve.services.gpu_worker.platforms.cpu import (
    FUSED_FP32_STEP_TOKENS,
    fused_fp32_step_tokens,
)
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams
from tests.unit.gpu_worker.fused_forward_checks import (
    BLOCK_SIZE,
    assert_greedy_unchanged,
    assert_logit_rows_keep_their_bits,
    assert_the_modules_bits,
    two_steps,
)

pytestmark = pytest.mark.skipif(
    str(torch.backends.cpu.get_cpu_capability()) not in ("AVX2", "AVX512"),
    reason="the float32 kernel is built for CPUs with AVX2",
)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    """SmolLM2 in float32 with its weights in the float32 kernel's panels (where MKL is at
    its best, Intel CPUs, the platform packs them for MKL instead: forced here)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_prepack, "fp32_uses_kernel", lambda: True)
        return LLMEngine(
            "smollm2",
            SchedulerConfig(max_model_len=1024),
            CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
            dtype="float32",
        )


def counting(monkeypatch, fused: CpuFusedForward) -> list[int]:
    calls, real = [], fused.forward
    monkeypatch.setattr(fused, "forward", lambda *args: calls.append(1) or real(*args))
    return calls


@pytest.mark.parametrize("first_prompt", [12, 24], ids=["by-row", "lanes"])
def test_is_built_for_float32_and_gives_the_module_paths_bits(engine, monkeypatch, first_prompt):
    model, fused = engine.runner.model, engine.runner.forward_pass
    assert isinstance(fused, CpuFusedForward) and fused.dtype == torch.float32
    calls = counting(monkeypatch, fused)
    # a first prompt of 12 tokens is attended by row, one of 24 on the float32 lanes
    steps = two_steps(model.config.vocab_size, first_prompt)
    assert_the_modules_bits(engine, steps, torch.float32)
    assert calls == [1, 1]


def test_a_prompt_step_goes_through_the_pass(engine, monkeypatch):
    fused = engine.runner.forward_pass
    assert cpu_paged_attention.max_query_len(torch.float32, 64) is None  # any chunk
    calls = counting(monkeypatch, fused)
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    result = engine.generate([" ".join(["word"] * 40)], greedy)[0]
    assert len(result.token_ids) == 2
    assert calls == [1, 1]  # the prompt's step and the decode's


def test_a_step_with_a_chunk_the_kernel_leaves_to_sdpa_goes_through_the_modules(
    engine, monkeypatch
):
    """Where the kernel has no lanes for a head (a head_dim past them), chunks of more than
    16 tokens are SDPA's, through the modules."""
    monkeypatch.setattr(cpu_paged_attention, "takes_any_chunk", lambda dtype, head_dim: False)
    longest = cpu_paged_attention.max_query_len(torch.float32, 64)
    assert longest == cpu_paged_attention.SHORT_QUERY_LEN
    calls = counting(monkeypatch, engine.runner.forward_pass)
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    prompt = " ".join(["word"] * (longest + 8))  # more tokens than the kernel's chunks
    engine.reset_prefix_cache()
    result = engine.generate([prompt], greedy)[0]
    assert len(result.token_ids) == 2
    assert calls == [1]  # the decode step only: the prompt's was SDPA's, through the modules


def test_greedy_generation_is_unchanged(engine):
    assert_greedy_unchanged(engine)


def test_given_its_logit_rows_the_last_layer_computes_only_those(engine):
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]
    assert_logit_rows_keep_their_bits(engine.runner.forward_pass, caches)


def test_a_slot_past_the_cache_or_a_cache_of_another_dtype_is_an_error(engine):
    forward, caches = engine.runner.forward_pass.forward, engine.runner.kv_caches
    num_blocks = caches[0][0].shape[0]
    cpu = torch.device("cpu")
    past = build_attention_metadata([1], [1], [[num_blocks]], BLOCK_SIZE, cpu)
    with torch.inference_mode(), pytest.raises(ValueError, match="past the caches"):
        forward(torch.tensor([5]), torch.tensor([0]), caches, past)
    bf16_caches = [(k.bfloat16(), v.bfloat16()) for k, v in caches]
    inside = build_attention_metadata([1], [1], [[0]], BLOCK_SIZE, cpu)
    with torch.inference_mode(), pytest.raises(ValueError, match=r"contiguous torch\.float32"):
        forward(torch.tensor([5]), torch.tensor([0]), bf16_caches, inside)


def test_the_default_budget_is_768_where_the_pass_takes_prompts(engine, monkeypatch):
    """768 tokens where the float32 pass takes prompt steps (through the service, 768-token
    steps cut TTFT p99 at 64 in flight without costing throughput or TPOT p99; see
    `platforms/cpu.py`), 512 where a core has less than 1 MiB of L2; the CPU's 512 where
    prompts leave the pass for SDPA and the modules."""
    fused, platform = engine.runner.forward_pass, engine.runner.platform
    assert fused.takes(1024) and fused.takes_prompts()
    here = fused_fp32_step_tokens(l2_bytes_per_core())
    assert platform.default_max_num_batched_tokens(fused) == here
    assert engine.scheduler.config.max_num_batched_tokens == here
    for l2_bytes, budget in ((1 << 20, FUSED_FP32_STEP_TOKENS), (512 << 10, 512), (None, 768)):
        monkeypatch.setattr(cpu_platform, "l2_bytes_per_core", lambda size=l2_bytes: size)
        assert platform.default_max_num_batched_tokens(fused) == budget
    assert FUSED_FP32_STEP_TOKENS == 768
    assert platform.default_max_num_batched_tokens(engine.runner.model) == 512
    monkeypatch.setattr(cpu_paged_attention, "takes_any_chunk", lambda dtype, head_dim: False)
    assert not fused.takes_prompts()
    assert platform.default_max_num_batched_tokens(fused) == 512


def test_not_built_where_mkl_holds_the_weights(engine, monkeypatch):
    """Intel CPUs keep MKL's packing for float32 (`cpu_prepack.fp32_uses_kernel`): no panels
    of the kernel's to multiply with, so the modules."""
    model = engine.runner.model
    assert CpuFusedForward.build(model) is not None
    layer = model.layers[2].mlp.down_proj
    mkl_form = cpu_prepack.Fp32Packing(None, torch.empty(1))
    monkeypatch.setattr(layer.linear_method, "packing", mkl_form)
    assert CpuFusedForward.build(model) is None
    monkeypatch.undo()
    monkeypatch.setattr(cpu_small_sgemm, "takes_swiglu", lambda num_inter: False)
    assert CpuFusedForward.build(model) is None
