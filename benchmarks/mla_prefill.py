"""MLA prefill, absorbed against expanded (`layers/mla_prefill.py`), one layer timed on the
same inputs in alternated rounds: a chunk of Q new tokens over C cached ones, at
DeepSeek-V2-Lite's attention (16 heads, kv_lora_rank 512, rope 64, nope 128, v 128; hidden
2048, q_proj without a low-rank query). Both forms are first checked to agree.

    python -m benchmarks.mla_prefill [--cases 0:128,0:512,1024:512] [--rounds 9]
        [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from benchmarks.machine_info import machine_info
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout
from pagedserve.services.gpu_worker.layers.mla_attention import MLAAttention, MLAShape
from pagedserve.services.gpu_worker.layers.rotary import RotaryEmbedding

V2_LITE = MLAShape(hidden_size=2048, num_heads=16, q_lora_rank=None, kv_lora_rank=512,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)  # fmt: skip
BLOCK_SIZE = 8
FORMS = {"absorbed": 1 << 30, "expanded": 1}  # expand_from: never, always


def make_layer(shape: MLAShape, expand_from: int) -> MLAAttention:
    layer = MLAAttention(shape, TorchAttentionBackend, scale=shape.qk_head_dim**-0.5,
                         expand_from=expand_from)  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for param in layer.parameters():
            std = param.shape[-1] ** -0.5 if param.dim() > 1 else 1.0
            param.copy_(torch.randn_like(param) * std)
    return layer


def run_case(shape: MLAShape, prefix: int, chunk: int, rounds: int) -> dict[str, object]:
    seq_len = prefix + chunk
    num_blocks = -(-seq_len // BLOCK_SIZE)
    layout = KVCacheLayout.from_specs([shape.kv_cache_spec()], BLOCK_SIZE, 1, 1, torch.float32)
    cache = layout.allocate(num_blocks + 1, torch.device("cpu"))[0]
    cache[0].normal_()  # the cached prefix's rows
    hidden = torch.randn(chunk, shape.hidden_size)
    angles = RotaryEmbedding(shape.qk_rope_head_dim, seq_len, 10000.0).angles(
        torch.arange(prefix, seq_len)
    )
    layers = {name: make_layer(shape, expand) for name, expand in FORMS.items()}
    times: dict[str, list[float]] = {name: [] for name in FORMS}
    outputs = {}
    with torch.no_grad():
        for _ in range(rounds):
            for name, layer in layers.items():
                metadata = build_attention_metadata(
                    [seq_len], [chunk], [list(range(num_blocks))], BLOCK_SIZE, torch.device("cpu")
                )
                start = time.perf_counter()
                outputs[name] = layer(angles, hidden, cache, metadata)
                times[name].append(time.perf_counter() - start)
    ratios = [a / e for a, e in zip(times["absorbed"], times["expanded"], strict=True)]
    return {
        "case": f"{chunk} over {prefix}",
        "absorbed_ms": 1e3 * statistics.median(times["absorbed"]),
        "expanded_ms": 1e3 * statistics.median(times["expanded"]),
        "absorbed_over_expanded_median": statistics.median(ratios),
        "absorbed_over_expanded_range": [min(ratios), max(ratios)],
        "max_abs_difference": float((outputs["absorbed"] - outputs["expanded"]).abs().max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="0:128,0:512,1024:512", help="prefix:chunk,...")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a small layer (smoke test)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = V2_LITE
    if args.tiny:
        shape = MLAShape(hidden_size=32, num_heads=4, q_lora_rank=None, kv_lora_rank=16,
                         qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)  # fmt: skip
    rows = []
    for case in args.cases.split(","):
        prefix, chunk = (int(n) for n in case.split(":"))
        row = run_case(shape, prefix, chunk, args.rounds)
        print(json.dumps(row), flush=True)
        rows.append(row)
    report = {"command": "python -m benchmarks.mla_prefill " + " ".join(argv or sys.argv[1:]),
              "threads": args.threads, "rows": rows, "machine": machine_info()}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
