"""The CPU fused forward pass of models whose attention has biases: Qwen2's q/k/v and Llama's
`attention_bias` (q/k/v and o), added inside the products as the modules add them, so the pass
and the modules give the same bits, in bf16 and in float32. Random biases throughout (a zero
bias would pass without being added)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_small_gemm
from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.platforms import cpu_prepack
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.fused_forward_checks import BLOCK_SIZE, run_steps, two_steps

# widths the kernels take: whole 32-column panels, heads of 64 (bf16 attention's vdpbf16ps)
SHAPE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
ARCHS = {"qwen2": {}, "llama": {"attention_bias": True}}
DTYPES = [
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(
            not cpu_small_gemm.cpu_has_avx512_bf16(), reason="bf16's pass needs AVX512-BF16"
        ),
    ),
    pytest.param(
        torch.float32,
        marks=pytest.mark.skipif(
            str(torch.backends.cpu.get_cpu_capability()) not in ("AVX2", "AVX512"),
            reason="float32's pass needs AVX2",
        ),
    ),
]


@pytest.fixture(params=ARCHS)
def model_dir(request, tmp_path_factory):
    arch = request.param
    return build_tiny_model(tmp_path_factory.mktemp(arch), arch, **SHAPE, **ARCHS[arch])


@pytest.fixture(params=DTYPES, ids=["bf16", "fp32"])
def engine(request, model_dir, monkeypatch) -> LLMEngine:
    # float32 weights in the float32 kernel's panels (on Intel CPUs the platform keeps MKL's)
    monkeypatch.setattr(cpu_prepack, "fp32_uses_kernel", lambda: True)
    engine = LLMEngine(
        model_dir,
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=512),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
        dtype=request.param,
    )
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in engine.runner.model.layers:
            for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
                if proj.bias is not None:  # in place: the pass holds their addresses
                    proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.5)
    return engine


def test_the_pass_adds_the_attentions_biases_as_the_modules_do(engine):
    model, fused = engine.runner.model, engine.runner.forward_pass
    assert isinstance(fused, CpuFusedForward)
    attn = model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None
    assert (attn.o_proj.bias is not None) == (model.config.model_type == "llama")
    steps = two_steps(model.config.vocab_size, 20)
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]
    module_caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        ours = run_steps(fused, caches, steps)
        theirs = run_steps(model, module_caches, steps)
        # the same steps with the biases zeroed: they change every output
        biases = [p.bias for layer in model.layers for p in (layer.self_attn.qkv_proj,)]
        kept = [b.clone() for b in biases]
        for b in biases:
            b.zero_()
        unbiased = run_steps(fused, [(k.clone(), v.clone()) for k, v in caches], steps)
        for b, k in zip(biases, kept, strict=True):
            b.copy_(k)
    for a, b, c in zip(ours, theirs, unbiased, strict=True):
        assert a.dtype == model.embed_tokens.weight.dtype and torch.equal(a, b)
        assert not torch.equal(a, c)
    for (k, v), (mk, mv) in zip(caches, module_caches, strict=True):
        assert torch.equal(k, mk) and torch.equal(v, mv)


def test_an_mlp_bias_or_a_bias_of_another_dtype_keeps_the_modules(engine):
    model = engine.runner.model
    assert CpuFusedForward.build(model) is not None
    layer = model.layers[1]
    qkv, down = layer.self_attn.qkv_proj, layer.mlp.down_proj
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qkv, "bias", torch.nn.Parameter(qkv.bias.double()))
        assert CpuFusedForward.build(model) is None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(down, "bias", torch.nn.Parameter(torch.zeros_like(down.weight[:, 0])))
        assert CpuFusedForward.build(model) is None  # Llama's mlp_bias: the SwiGLU adds none
    assert CpuFusedForward.build(model) is not None
