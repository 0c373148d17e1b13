"""The grouped expert path of `FusedMoE` against a per-token loop, in one run.

A Mixtral MoE layer (built by `mixtral_moe` from a transformers `MixtralConfig`, random
weights) runs a step of N tokens twice: as served (tokens sorted by expert, one gate/up and
one down product per expert: `grouped_experts`) and with its expert op swapped for a loop
over each token's chosen experts (one row per product, as a naive implementation or a
per-token reference does). Both give the same output (checked first); rounds alternate the
two on the same inputs, and each row reports the medians and grouped/per-token speed-up,
with the machine's ISA record.

    python -m benchmarks.moe_grouping [--tokens 1,16,64,256] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

from benchmarks.machine_info import machine_info
from pagedserve.services.gpu_worker.layers.fused_moe import StackedExperts
from pagedserve.services.gpu_worker.platforms.cpu_prepack import prepack_linears


def per_token_experts(
    x: torch.Tensor,  # [T, H]
    experts: StackedExperts,
    weights: torch.Tensor,  # [T, k]
    ids: torch.Tensor,  # [T, k]
    act_and_mul: nn.Module,
) -> torch.Tensor:
    """The baseline: each token through each of its experts, one row at a time (through
    the same linear methods as the grouped path)."""
    out = torch.zeros_like(x)
    for t, (token_weights, token_ids) in enumerate(zip(weights, ids.tolist(), strict=True)):
        for weight, expert in zip(token_weights, token_ids, strict=True):
            hidden = act_and_mul(experts.product("w13_weight", expert, x[t : t + 1]))
            out[t] += weight * experts.product("w2_weight", expert, hidden)[0]
    return out


class PerTokenExperts(nn.Module):
    def forward(self, *args: torch.Tensor | nn.Module) -> torch.Tensor:
        return per_token_experts(*args)


def build_layer(args: argparse.Namespace) -> nn.Module:
    from transformers import MixtralConfig

    from pagedserve.services.gpu_worker.models.mixtral import mixtral_moe

    config = MixtralConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_local_experts=args.experts, num_experts_per_tok=args.top_k,
    )  # fmt: skip
    torch.manual_seed(0)
    layer = mixtral_moe(config)
    for param in layer.parameters():
        param.data.normal_(0, 0.02)
    if not args.no_prepack:  # as the CPU platform serves it
        prepack_linears(layer)
    return layer.eval()


def time_call(layer: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of `layer(x)` over `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        layer(x)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


@torch.inference_mode()
def measure(layer: nn.Module, num_tokens: int, rounds: int, repeats: int) -> dict[str, Any]:
    grouped_op, per_token_op = layer.compute_experts, PerTokenExperts()
    x = torch.randn(num_tokens, layer.gate.weight.shape[1])
    expected = layer(x)
    layer.compute_experts = per_token_op
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-5)
    grouped_ms, per_token_ms = [], []
    for _ in range(rounds):
        layer.compute_experts = grouped_op
        grouped_ms.append(time_call(layer, x, repeats))
        layer.compute_experts = per_token_op
        per_token_ms.append(time_call(layer, x, repeats))
    layer.compute_experts = grouped_op
    ratios = [p / g for g, p in zip(grouped_ms, per_token_ms, strict=True)]
    return {
        "tokens": num_tokens,
        "grouped_ms": statistics.median(grouped_ms),
        "per_token_ms": statistics.median(per_token_ms),
        "speedup": statistics.median(ratios),  # per round: per-token / grouped
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.moe_grouping", description=__doc__)
    p.add_argument("--tokens", default="1,16,64,256")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=1792)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-prepack", action="store_true", help="torch's F.linear products")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    layer = build_layer(args)
    rows = []
    for num_tokens in (int(n) for n in args.tokens.split(",")):
        rows.append(measure(layer, num_tokens, args.rounds, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    report = {"machine": machine_info(), "threads": torch.get_num_threads(),
              "layer": vars(args), "rows": rows}  # fmt: skip
    print(json.dumps({"machine": report["machine"], "threads": report["threads"]}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
