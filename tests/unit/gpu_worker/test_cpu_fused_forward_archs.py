"""The CPU fused forward pass of the Llama layer's variants: attention biases (Qwen2's q/k/v,
Llama's `attention_bias` on q/k/v and o), added inside the products as the modules add them,
Qwen3's RMSNorm of each query and key head, normed in the qkv rows as the modules norm
them, SmolLM3's layers without rotary embedding, and OLMo 2's and EXAONE 4's post-norm
layers (with q/k norms over the whole projection, or of each head); the pass and the modules
give the same bits, in bf16 and in float32. The parameters that set each apart are random
and are shown to matter (a zero bias or a unit norm weight would pass without being
applied), as is each layer's rotating or not."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_small_gemm
from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.platforms import cpu_prepack
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.fused_forward_checks import (
    BLOCK_SIZE,
    assert_logit_rows_keep_their_bits,
    assert_the_modules_bits,
    run_steps,
    two_steps,
)

# widths the kernels take: whole 32-column panels, heads of 64 (bf16 attention's vdpbf16ps)
SHAPE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
ARCHS = {"qwen2": {}, "llama": {"attention_bias": True}, "qwen3": {"head_dim": 64}}
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


def distinctive(model) -> list[torch.Tensor]:
    """The parameters that set the model's layers apart from Llama's: biases, q/k norms."""
    found = []
    for layer in model.layers:
        attn = layer.self_attn
        found += [p.bias for p in (attn.qkv_proj, attn.o_proj) if p.bias is not None]
        found += [n.weight for n in (attn.q_norm, attn.k_norm) if n is not None]
    return found


def make_engine(model_dir, dtype, monkeypatch) -> LLMEngine:
    # float32 weights in the float32 kernel's panels (on Intel CPUs the platform keeps MKL's)
    monkeypatch.setattr(cpu_prepack, "fp32_uses_kernel", lambda: True)
    return LLMEngine(
        model_dir,
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=512),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
        dtype=dtype,
    )


@pytest.fixture(params=DTYPES, ids=["bf16", "fp32"])
def engine(request, model_dir, monkeypatch) -> LLMEngine:
    engine = make_engine(model_dir, request.param, monkeypatch)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # in place: the pass holds their addresses
        for param in distinctive(engine.runner.model):
            param.add_(torch.randn(param.shape, generator=gen) * 0.5)
    return engine


def test_the_pass_gives_the_modules_bits(engine):
    model, fused = engine.runner.model, engine.runner.forward_pass
    assert isinstance(fused, CpuFusedForward)
    attn = model.layers[0].self_attn
    kind = model.config.model_type
    assert (attn.qkv_proj.bias is not None) == (kind != "qwen3")
    assert (attn.o_proj.bias is not None) == (kind == "llama")
    assert (attn.q_norm is not None) == (kind == "qwen3")
    steps = two_steps(model.config.vocab_size, 20)
    assert_the_modules_bits(engine, steps, model.embed_tokens.weight.dtype)


def through_both(engine: LLMEngine):
    """A function that runs two steps through the engine's pass and through its modules, from
    the same random caches each call: (the pass's outputs, the modules')."""
    model, fused = engine.runner.model, engine.runner.forward_pass
    steps = two_steps(model.config.vocab_size, 20)
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]

    def both():
        copies = [[(k.clone(), v.clone()) for k, v in caches] for _ in range(2)]
        with torch.inference_mode():
            return run_steps(fused, copies[0], steps), run_steps(model, copies[1], steps)

    return both


def test_what_sets_the_layers_apart_is_applied(engine):
    """With the biases zeroed (or the q/k norm weights all ones) the pass gives other
    outputs, and still the modules' bits."""
    model, both = engine.runner.model, through_both(engine)
    before, _ = both()
    with torch.no_grad():
        for param in distinctive(model):
            param.fill_(1.0 if param.dim() == 1 and model.config.model_type == "qwen3" else 0.0)
    after, modules = both()
    for a, b, m in zip(before, after, modules, strict=True):
        assert not torch.equal(a, b) and torch.equal(b, m)


def test_what_the_loop_cannot_take_keeps_the_modules(engine):
    """A bias of another dtype, q and k norms of different epsilons, an MLP bias."""
    model = engine.runner.model
    assert CpuFusedForward.build(model) is not None
    layer = model.layers[1]
    attn, down = layer.self_attn, layer.mlp.down_proj
    with pytest.MonkeyPatch.context() as patch:
        if attn.q_norm is not None:
            patch.setattr(attn.k_norm, "eps", attn.q_norm.eps * 2)
        else:
            patch.setattr(attn.qkv_proj, "bias", torch.nn.Parameter(attn.qkv_proj.bias.double()))
        assert CpuFusedForward.build(model) is None
    with pytest.MonkeyPatch.context() as patch:
        bias = torch.zeros(down.weight.shape[0], dtype=down.weight.dtype)
        patch.setattr(down, "bias", torch.nn.Parameter(bias))
        assert CpuFusedForward.build(model) is None  # Llama's mlp_bias: the SwiGLU adds none
    assert CpuFusedForward.build(model) is not None


@pytest.fixture(params=DTYPES, ids=["bf16", "fp32"])
def smollm3_engine(request, tmp_path, monkeypatch) -> LLMEngine:
    """Layers 0-2 rotate, layer 3 does not (every fourth, by default)."""
    model_dir = build_tiny_model(tmp_path, "smollm3", **SHAPE, num_hidden_layers=4)
    return make_engine(model_dir, request.param, monkeypatch)


def test_smollm3s_nope_layer_goes_unrotated_through_the_pass(smollm3_engine, monkeypatch):
    """The pass gives the modules' bits; with the NoPE layer made to rotate, both give other
    outputs, the same again: the pass takes each layer's rotating or not from its module."""
    engine = smollm3_engine
    model = engine.runner.model
    assert isinstance(engine.runner.forward_pass, CpuFusedForward)
    assert [layer.self_attn.use_rope for layer in model.layers] == [True, True, True, False]
    steps = two_steps(model.config.vocab_size, 20)
    assert_the_modules_bits(engine, steps, model.embed_tokens.weight.dtype)
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]

    def through(forward_pass):
        with torch.inference_mode():
            return run_steps(forward_pass, [(k.clone(), v.clone()) for k, v in caches], steps)

    nope = through(engine.runner.forward_pass)
    monkeypatch.setattr(model.layers[3].self_attn, "use_rope", True)
    rotated = CpuFusedForward.build(model)
    for a, b, m in zip(nope, through(rotated), through(model), strict=True):
        assert not torch.equal(a, b) and torch.equal(b, m)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
def test_ernie4_5_is_a_llama_model_to_the_pass(dtype, tmp_path, monkeypatch):
    """Its interleaved rotary pairs are made rotate-half ones at load, so the pass takes it
    and gives the modules' bits."""
    model_dir = build_tiny_model(tmp_path, "ernie4_5", **SHAPE, head_dim=64)
    engine = make_engine(model_dir, dtype, monkeypatch)
    model = engine.runner.model
    assert isinstance(engine.runner.forward_pass, CpuFusedForward)
    assert_the_modules_bits(engine, two_steps(model.config.vocab_size, 20), dtype)


# OLMo 2: q/k norms over the whole projection; EXAONE 4 without a window: of each head
POST_NORM_ARCHS = {"olmo2": {}, "exaone4": {"sliding_window": None, "head_dim": 64}}


@pytest.fixture(params=[(a, d) for a in POST_NORM_ARCHS for d in DTYPES], ids=lambda p: p[0])
def post_norm_engine(request, tmp_path, monkeypatch) -> LLMEngine:
    arch, dtype = request.param
    layers = dict(num_hidden_layers=3, layer_types=["full_attention"] * 3)
    model_dir = build_tiny_model(tmp_path, arch, **SHAPE, **layers, **POST_NORM_ARCHS[arch])
    return make_engine(model_dir, dtype.values[0], monkeypatch)


def test_post_norm_layers_go_through_the_pass_with_the_modules_bits(post_norm_engine):
    """Each norm after its branch, the q/k norms as the model has them, the last layer's rows
    cut to the sampled ones as in Llama's layer."""
    engine = post_norm_engine
    model, fused = engine.runner.model, engine.runner.forward_pass
    assert isinstance(fused, CpuFusedForward)
    whole = model.config.model_type == "olmo2"
    assert fused.shape.post_norms and fused.shape.qk_norm_whole == whole
    assert model.layers[0].self_attn.q_norm.weight.shape[0] == (256 if whole else 64)
    vocab = model.config.vocab_size
    assert_the_modules_bits(engine, two_steps(vocab, 20), model.embed_tokens.weight.dtype)
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]
    assert_logit_rows_keep_their_bits(fused, caches, vocab)


def test_each_post_norm_is_applied(post_norm_engine):
    """With any one of a layer's four norm weights made all ones, the pass gives other
    outputs, and still the modules' bits."""
    both = through_both(post_norm_engine)
    before, _ = both()
    layer = post_norm_engine.runner.model.layers[1]
    norms = (layer.post_attention_layernorm, layer.post_feedforward_layernorm,
             layer.self_attn.q_norm, layer.self_attn.k_norm)  # fmt: skip
    for norm in norms:
        kept = norm.weight.detach().clone()
        with torch.no_grad():  # in place: the pass holds its address
            norm.weight.fill_(1.0)
        after, modules = both()
        with torch.no_grad():
            norm.weight.copy_(kept)
        for a, b, m in zip(before, after, modules, strict=True):
            assert not torch.equal(a, b) and torch.equal(b, m)


def test_exaone4_with_window_layers_keeps_the_modules(tmp_path, monkeypatch):
    """The C attention kernel has no window."""
    model_dir = build_tiny_model(tmp_path, "exaone4", **SHAPE, head_dim=64)
    engine = make_engine(model_dir, torch.float32, monkeypatch)
    assert engine.runner.forward_pass is engine.runner.model
