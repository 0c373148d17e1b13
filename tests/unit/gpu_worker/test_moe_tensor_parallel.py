"""Mixture-of-experts models at TP=2 over gloo (see `test_tensor_parallel.py`): each rank
holds every expert's half of the intermediate features, and a layer all-reduces once: the
routed experts' partial sums and Qwen2-MoE's shared expert's together (GPT-OSS's down bias
is added on rank 0 only, and each rank holds its heads' attention sinks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pagedserve.services.gpu_worker.layers.fused_moe import FusedMoE
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.moe_routing import Routing
from tests.fixtures.gloo_exit import leave_together
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.test_tensor_parallel import check_tp2_matches_hf, free_port


@pytest.mark.slow
def test_moe_models_at_tp2_over_gloo_match_hf(tmp_path: Path) -> None:
    model_dirs = [
        build_tiny_model(tmp_path / arch, arch, seed=5)
        for arch in ("mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss")
    ]
    prompts = {"a": list(range(3, 40)), "b": [11], "c": list(range(200, 213))}
    check_tp2_matches_hf(model_dirs, prompts)


# One Qwen2-MoE-style layer (routed experts + a gated shared expert with biases) at TP=2:
# each rank's output equals the whole layer's, and each forward all-reduces once.
LAYER = {"hidden": 16, "intermediate": 24, "shared": 32, "experts": 4, "top_k": 2}


def full_layer_weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, i, s, e = LAYER["hidden"], LAYER["intermediate"], LAYER["shared"], LAYER["experts"]
    shapes = {"router": (e, h), "shared_gate": (1, h), "gate_up": (2 * s, h),
              "gate_up_bias": (2 * s,), "down": (h, s), "down_bias": (h,)}  # fmt: skip
    shapes.update({f"{p}{x}": (i, h) for x in range(e) for p in ("gate", "up")})
    shapes.update({f"down{x}": (h, i) for x in range(e)})
    return {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}


def build_layer(full: dict[str, torch.Tensor]) -> FusedMoE:
    """The layer as this rank holds it, filled from the full tensors as a checkpoint fills it."""
    h, s = LAYER["hidden"], LAYER["shared"]
    shared = GatedMLP(h, s, "silu", bias=True, reduce_results=False)
    moe = FusedMoE(h, LAYER["intermediate"], LAYER["experts"], Routing(LAYER["top_k"]),
                   shared_expert=shared)  # fmt: skip
    moe.gate.weight.data.copy_(full["router"])
    moe.shared_expert_gate.weight.data.copy_(full["shared_gate"])
    for part, name in enumerate(("gate_up", "gate_up_bias")):
        param = shared.gate_up_proj.weight if part == 0 else shared.gate_up_proj.bias
        for shard_id, half in enumerate(full[name].chunk(2)):
            shared.gate_up_proj.weight_loader(param, half, shard_id)
    shared.down_proj.weight_loader(shared.down_proj.weight, full["down"])
    shared.down_proj.bias_loader(shared.down_proj.bias, full["down_bias"])
    for expert in range(LAYER["experts"]):
        for part in ("gate", "up", "down"):
            moe.experts.load_expert(expert, part, full[f"{part}{expert}"])
    return moe


def _layer_worker(rank: int, port: int, queue, exit_barrier) -> None:
    import torch.distributed as dist

    from pagedserve.services.gpu_worker.parallel_state import (
        destroy_tensor_parallel,
        init_tensor_parallel,
    )

    init_tensor_parallel(rank, 2, "127.0.0.1", port, backend="gloo")
    try:
        moe = build_layer(full_layer_weights(seed=7))
        reduces = []
        real_all_reduce = dist.all_reduce
        dist.all_reduce = lambda t, *a, **k: reduces.append(1) or real_all_reduce(t, *a, **k)
        outputs, counts = [], []
        for num_tokens in (1, 9):  # a decode, a prefill
            x = torch.randn(num_tokens, LAYER["hidden"], generator=torch.Generator().manual_seed(1))
            reduces.clear()
            with torch.inference_mode():
                outputs.append(moe(x))
            counts.append(len(reduces))
        dist.all_reduce = real_all_reduce
        # plain lists: a tensor would travel as a shared-memory handle that dies with this
        # process, which may exit before the parent reads it
        queue.put((rank, [out.tolist() for out in outputs], counts))
        dist.barrier()
    except BaseException:
        destroy_tensor_parallel()
        raise
    leave_together(exit_barrier, queue)  # tests/fixtures/gloo_exit.py


@pytest.mark.slow
def test_a_moe_layer_with_a_shared_expert_all_reduces_once_at_tp2() -> None:
    with torch.inference_mode():
        whole = build_layer(full_layer_weights(seed=7))  # world size 1 in this process
        expected = [
            whole(torch.randn(n, LAYER["hidden"], generator=torch.Generator().manual_seed(1)))
            for n in (1, 9)
        ]
    ctx = mp.get_context("spawn")
    queue, exit_barrier = ctx.Queue(), ctx.Barrier(2)
    port = free_port()
    procs = [
        ctx.Process(target=_layer_worker, args=(rank, port, queue, exit_barrier))
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    results = dict((rank, (outs, counts)) for rank, outs, counts in
                   (queue.get(timeout=120) for _ in procs))  # fmt: skip
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    for rank, (outputs, counts) in results.items():
        assert counts == [1, 1], f"rank {rank} all-reduced {counts} times per forward"
        for out, want in zip(outputs, expected, strict=True):
            torch.testing.assert_close(torch.tensor(out), want, rtol=1e-5, atol=1e-5)


def test_the_layer_refuses_a_shared_expert_that_reduces_itself() -> None:
    shared = GatedMLP(LAYER["hidden"], LAYER["shared"], "silu")  # reduce_results=True
    with pytest.raises(ValueError, match="reduce_results=False"):
        FusedMoE(LAYER["hidden"], LAYER["intermediate"], 4, Routing(2), shared_expert=shared)


def test_qwen2_moe_layer_calls_all_reduce_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """At world size 1 the collective is the identity, but the layer still asks for it:
    counting the asks counts the reduces a TP run makes."""
    from pagedserve.services.gpu_worker.layers import fused_moe, linear

    asks: list[int] = []
    for module in (fused_moe, linear):
        monkeypatch.setattr(module, "all_reduce", lambda t: asks.append(1) or t)
    with torch.inference_mode():
        build_layer(full_layer_weights(seed=2))(torch.randn(5, LAYER["hidden"]))
    assert asks == [1]


@pytest.mark.slow
def test_deepseek_at_tp2_over_gloo_matches_hf(tmp_path: Path) -> None:
    """MLA at TP=2: each rank holds half the heads of q_b_proj/q_proj, kv_b_proj and o_proj,
    and the whole latent cache; the shared experts' partial sums join the routed experts'
    in the layer's one all-reduce."""
    model_dirs = [
        build_tiny_model(tmp_path / arch, arch, seed=6) for arch in ("deepseek_v2", "deepseek_v3")
    ]
    prompts = {"a": list(range(3, 40)), "b": [11], "c": list(range(200, 213))}
    check_tp2_matches_hf(model_dirs, prompts)
