"""The CPU bf16 forward pass as one loop of C calls (`cpu_fused_forward.py`): the same bits as
the module path, for prompts, chunks over a cached prefix, decodes and draft rows in one step,
with the fused SwiGLU and in the AMX form (the product, then silu_and_mul); the module path
wherever it does not apply."""

from __future__ import annotations

import ctypes

import pytest
import torch

from pagedserve.kernels import cpu_layer_loop, cpu_small_gemm
from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.platforms.cpu import FUSED_STEP_TOKENS
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import SWITCH, CpuFusedForward
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams
from tests.unit.gpu_worker.fused_forward_checks import (
    BLOCK_SIZE,
    assert_greedy_unchanged,
    assert_logit_rows_keep_their_bits,
    assert_the_modules_bits,
    run_steps,
    two_steps,
)

# silu_and_mul(x, m, n_inter, x_stride, y, y_stride), as the layer loop calls it
SILU_AND_MUL = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int64,
)

pytestmark = pytest.mark.skipif(
    not cpu_small_gemm.cpu_has_avx512_bf16(), reason="built for CPUs with AVX512-BF16"
)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(
        "smollm2",
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=1024),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
        dtype="bfloat16",
    )


def test_is_built_here_and_gives_the_module_paths_bits(engine, monkeypatch):
    model = engine.runner.model
    fused = engine.runner.forward_pass
    assert isinstance(fused, CpuFusedForward)  # the CPU platform chose it for SmolLM2
    calls, real = [], fused.forward
    monkeypatch.setattr(fused, "forward", lambda *args: calls.append(1) or real(*args))
    assert_the_modules_bits(engine, two_steps(model.config.vocab_size, 20), torch.bfloat16)
    assert calls == [1, 1]  # both steps took the fused path


def test_the_amx_form_multiplies_then_silu_and_mul_and_keeps_the_bits(engine, monkeypatch):
    """Where the AMX tiles take K, the MLP's gate-and-up product is followed by silu_and_mul,
    in the fused forward and in the module path alike, with the fused pass's bits. Where the
    CPU has no AMX the `vdpbf16ps` product stands in for the AMX tiles', so the bits compared
    are silu_and_mul's against the fused SwiGLU's (the tiles themselves run in software in
    `test_cpu_fused_forward_amx.py`)."""
    model = engine.runner.model
    steps = two_steps(model.config.vocab_size, 20)
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]
    copies = [[(k.clone(), v.clone()) for k, v in caches] for _ in range(2)]
    with torch.inference_mode():
        expected = run_steps(engine.runner.forward_pass, caches, steps)
    if not cpu_small_gemm.amx_available():
        library = cpu_small_gemm.load()
        monkeypatch.setattr(cpu_small_gemm, "uses_amx", lambda num_in: num_in % 32 == 0)
        monkeypatch.setattr(cpu_small_gemm, "product_for", lambda num_in: library.small_gemm)
    module_calls, real = [], cpu_small_gemm.silu_and_mul
    monkeypatch.setattr(cpu_small_gemm, "silu_and_mul", lambda x: module_calls.append(1) or real(x))
    amx_form = CpuFusedForward.build(model)
    assert amx_form is not None and not amx_form.fuses_swiglu
    fused_calls, real_c = [], amx_form.silu_and_mul
    # the C layer loop calls silu_and_mul through its pointer: a counting callback in its place
    counting = SILU_AND_MUL(lambda *args: fused_calls.append(1) or real_c(*args))
    assert amx_form.kernels.swiglu is None
    assert amx_form.kernels.silu_and_mul == cpu_layer_loop.address_of(real_c)
    amx_form.kernels.silu_and_mul = cpu_layer_loop.address_of(counting)
    with torch.inference_mode():
        ours = run_steps(amx_form, copies[0], steps)
        theirs = run_steps(model, copies[1], steps)
    num_layers = len(model.layers)
    assert len(fused_calls) == len(module_calls) == 2 * num_layers  # every layer, both steps
    for a, b, c in zip(ours, theirs, expected, strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)
    for (k, v), (mk, mv) in zip(copies[0], caches, strict=True):
        assert torch.equal(k, mk) and torch.equal(v, mv)


def test_greedy_generation_is_unchanged(engine):
    assert_greedy_unchanged(engine)


def test_given_its_logit_rows_the_last_layer_computes_only_those(engine):
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]
    assert_logit_rows_keep_their_bits(engine.runner.forward_pass, caches)


def test_steps_past_its_rows_go_through_the_modules(engine, monkeypatch):
    fused = engine.runner.forward_pass
    assert fused.takes(1) and fused.takes(fused.max_rows) and not fused.takes(fused.max_rows + 1)
    assert not fused.takes(0)
    calls = []
    real = fused.forward
    monkeypatch.setattr(fused, "max_rows", 8)
    monkeypatch.setattr(fused, "forward", lambda *args: calls.append(1) or real(*args))
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    result = engine.generate(["a prompt of more than eight tokens, so its prefill"], greedy)[0]
    assert len(result.token_ids) == 2
    assert calls == [1]  # the one-token decode step only


def test_without_amx_it_takes_steps_past_the_modules_products(engine, monkeypatch):
    """Without AMX the pass takes up to 2048 rows, more than the modules' products (512,
    oneDNN's past them): a 600-token prompt goes through it, and its hidden states agree with
    the modules' as two bf16 products do."""
    fused = engine.runner.forward_pass
    if cpu_small_gemm.amx_available():
        assert fused.max_rows == cpu_small_gemm.AMX_MAX_ROWS
        return
    assert fused.max_rows == cpu_small_gemm.FUSED_MAX_ROWS_WITHOUT_AMX
    assert fused.max_rows > cpu_small_gemm.max_rows(576)
    model, num_tokens = engine.runner.model, 600
    # seeded: on a few draws of random words a row's bf16 roundings drift apart over the 30
    # layers (cosine ~0.95), and the draw depended on the tests run before this one
    gen = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=gen)
    table = list(range(-(-num_tokens // BLOCK_SIZE)))
    metadata = build_attention_metadata(
        [num_tokens], [num_tokens], [table], BLOCK_SIZE, torch.device("cpu")
    )
    step = (token_ids, torch.arange(num_tokens), metadata)
    caches = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in engine.runner.kv_caches]
    module_caches = [(k.clone(), v.clone()) for k, v in caches]
    calls, real = [], fused.forward
    monkeypatch.setattr(fused, "forward", lambda *args: calls.append(1) or real(*args))
    with torch.inference_mode():
        (ours,) = run_steps(fused, caches, [step])
        (theirs,) = run_steps(model, module_caches, [step])
    assert calls == [1]
    cosine = torch.nn.functional.cosine_similarity(ours.float(), theirs.float(), dim=-1)
    assert cosine.min() > 0.99


def test_the_default_budget_is_1024_tokens_where_the_pass_takes_such_steps(engine, monkeypatch):
    """1024-token steps where the fused pass takes them (bf16 without AMX), else the CPU's
    512: through the modules, and beside AMX's 128-row pass."""
    platform, fused = engine.runner.platform, engine.runner.forward_pass
    expected = FUSED_STEP_TOKENS if fused.takes(FUSED_STEP_TOKENS) else 512
    assert platform.default_max_num_batched_tokens(fused) == expected
    assert platform.default_max_num_batched_tokens(engine.runner.model) == 512
    monkeypatch.setattr(fused, "max_rows", cpu_small_gemm.AMX_MAX_ROWS)
    assert platform.default_max_num_batched_tokens(fused) == 512
    monkeypatch.setattr(fused, "max_rows", cpu_small_gemm.FUSED_MAX_ROWS_WITHOUT_AMX)
    assert platform.default_max_num_batched_tokens(fused) == FUSED_STEP_TOKENS == 1024


def test_an_engine_given_no_budget_steps_by_the_passs_default():
    """The runner asks the platform with the forward pass it built, and the scheduler adopts
    the answer (a runner asking with the model would get 512)."""
    engine = LLMEngine(
        "smollm2", SchedulerConfig(max_model_len=1024),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64), dtype="bfloat16",
    )  # fmt: skip
    fused = engine.runner.forward_pass
    expected = FUSED_STEP_TOKENS if fused.takes(FUSED_STEP_TOKENS) else 512
    assert engine.shape.max_num_batched_tokens == expected
    assert engine.scheduler.config.max_num_batched_tokens == expected


def test_a_slot_past_the_cache_is_an_error(engine):
    num_blocks = engine.runner.kv_caches[0][0].shape[0]
    metadata = build_attention_metadata([1], [1], [[num_blocks]], BLOCK_SIZE, torch.device("cpu"))
    with torch.inference_mode(), pytest.raises(ValueError, match="past the caches"):
        engine.runner.forward_pass.forward(
            torch.tensor([5]), torch.tensor([0]), engine.runner.kv_caches, metadata
        )


def test_logit_rows_outside_the_step_are_an_error(engine):
    tokens, positions, metadata = two_steps(engine.runner.model.config.vocab_size, 20)[1]
    fused = engine.runner.forward_pass
    for rows in ([3, 10], [-1]):
        with torch.inference_mode(), pytest.raises(ValueError, match=r"logit rows must lie in"):
            fused(tokens, positions, engine.runner.kv_caches, metadata, torch.tensor(rows))


def test_not_built_where_it_does_not_apply(engine, monkeypatch):
    model = engine.runner.model
    assert CpuFusedForward.build(model) is not None
    monkeypatch.setenv(SWITCH, "0")
    assert CpuFusedForward.build(model) is None
    monkeypatch.delenv(SWITCH)
    layer = model.layers[3].mlp.gate_up_proj
    monkeypatch.setattr(layer, "bias", torch.zeros(layer.weight.shape[0], dtype=torch.bfloat16))
    assert CpuFusedForward.build(model) is None  # an MLP bias: the modules


def test_not_built_for_another_architecture(tmp_path):
    from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
    from pagedserve.services.gpu_worker.model_loader import load_model
    from tests.fixtures.tiny_models import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "olmo2", "olmo2")
    model = load_model(model_dir, TorchAttentionBackend, torch.bfloat16, torch.device("cpu"))
    assert CpuFusedForward.build(model) is None  # post-norms: not the Llama layer's ops
