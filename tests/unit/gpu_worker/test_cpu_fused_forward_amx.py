"""The CPU bf16 forward pass of an engine built as on a CPU with AMX-BF16: its linears on the
AMX tiles (up to 128 rows), the MLP's product followed by silu_and_mul, oneDNN's copy of the
weights not kept. Where the CPU has no AMX the tiles run in software (`amx_emulation.h`,
checking what the hardware faults on), so the AMX code runs here end to end: the fused pass
and the modules give the same bits on the tiles, and greedy generation is the same through
both."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_small_gemm
from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.platforms import cpu_prepack
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from tests.kernels import amx_emulation
from tests.unit.gpu_worker.fused_forward_checks import (
    BLOCK_SIZE,
    assert_greedy_unchanged,
    assert_the_modules_bits,
    two_steps,
)

pytestmark = pytest.mark.skipif(
    not cpu_small_gemm.cpu_has_avx512_bf16(), reason="built for CPUs with AVX512-BF16"
)


@pytest.fixture
def amx(monkeypatch):
    """The emulated library where the CPU has no AMX (None where it runs real tiles)."""
    library = (
        None if cpu_small_gemm.amx_available() else amx_emulation.use_emulated_amx(monkeypatch)
    )
    yield library
    amx_emulation.forget_amx()
    if library is not None:
        assert amx_emulation.fault(library) == ""


@pytest.fixture
def engine(amx) -> LLMEngine:
    return LLMEngine(
        "smollm2",
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=1024),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
        dtype="bfloat16",
    )


def test_the_engine_is_built_for_the_tiles(engine):
    fused = engine.runner.forward_pass
    assert isinstance(fused, CpuFusedForward) and not fused.fuses_swiglu
    assert fused.max_rows == cpu_small_gemm.AMX_MAX_ROWS
    assert fused.kernels.swiglu is None and fused.kernels.silu_and_mul
    layer = engine.runner.model.layers[0]
    packing = cpu_prepack.packing_of(layer.mlp.gate_up_proj)
    assert isinstance(packing, cpu_prepack.Bf16Packing) and packing.few_rows is not None
    assert packing.onednn is None  # past the tiles' 128 rows, F.linear is as fast


def test_the_pass_and_the_modules_give_the_same_bits_on_the_tiles(engine, amx):
    steps = two_steps(engine.runner.model.config.vocab_size, 20)
    assert_the_modules_bits(engine, steps, torch.bfloat16)
    if amx is not None:
        assert amx_emulation.products(amx) > 0


def test_greedy_generation_is_the_same_through_the_pass_and_the_modules(engine, amx):
    assert_greedy_unchanged(engine)
    if amx is not None:
        assert amx_emulation.products(amx) > 0
