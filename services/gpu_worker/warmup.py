"""What a worker runs before it says ready, so that no request pays for it.

- `run_worst_step`: the largest step the scheduler can send, for the CUDA memory profile: a
  prefill of the whole token budget AND the sampler over `max_num_seqs` rows of full-vocabulary
  fp32 logits with every sampling feature on (penalties, top-k/top-p/min-p, seeds, logprobs),
  as vLLM's profile run does. At 256 rows of a 128k vocabulary the sampler's fp32 copies are
  several times the 128 MB of the logits, more than a 2048-token prefill's activations of a
  small model.
- `warm_up`: one call of every Triton kernel variant the `triton` backend can launch (KV
  write, prefill/extend on the flat grid, decode single-pass, decode split + the reduce for
  every split-count class) and one run of the sampler, so that Triton's JIT compiles (seconds
  each on a GPU) and the first-use set-up of the torch ops happen here, not inside the first
  requests. Kernel arguments that change from step to step are not specialised on by the
  kernels (`do_not_specialize`), so these compiled variants are the ones that serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.sampler import MAX_LOGPROBS, SamplingRow, sample
from pagedserve.shared.protocol import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LayerMasks:
    """What sets a layer's attention kernels apart (each its own compiled variant): its
    sliding window, logit soft-cap and attention sinks (their dtype, which the kernels also
    specialise on)."""

    sliding_window: int | None = None
    softcap: float | None = None
    sinks_dtype: torch.dtype | None = None

    def label(self) -> str:
        """ "" for plain layers, else e.g. " (window 128, sinks)"."""
        parts = [f"window {self.sliding_window}"] if self.sliding_window is not None else []
        parts += ["softcap"] if self.softcap is not None else []
        parts += ["sinks"] if self.sinks_dtype is not None else []
        return f" ({', '.join(parts)})" if parts else ""

    def kernel_options(self, num_heads: int, device: torch.device) -> dict[str, Any]:
        """The kernels' keyword arguments for such a layer (sinks: zeros of their dtype)."""
        sinks = None
        if self.sinks_dtype is not None:
            sinks = torch.zeros(num_heads, dtype=self.sinks_dtype, device=device)
        return {"sliding_window": self.sliding_window, "softcap": self.softcap, "sinks": sinks}


def layer_masks(backend: object) -> LayerMasks:
    """A layer's masks, read from its attention backend."""
    sinks = getattr(backend, "sinks", None)
    return LayerMasks(
        getattr(backend, "sliding_window", None),
        getattr(backend, "logit_softcap", None),
        None if sinks is None else sinks.dtype,
    )


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One rank's attention geometry, as the model's layers see it, and the distinct masks
    of its layers (GPT-OSS: windowed and full layers, both with sinks)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    layer_masks: tuple[LayerMasks, ...] = (LayerMasks(),)


def sampler_rows(num_rows: int, vocab_size: int) -> list[SamplingRow]:
    """`num_rows` rows that together take every branch of `sample`: greedy and random rows,
    penalties over a prompt and an output, a logit bias, top-k/top-p/min-p, seeded and
    unseeded draws, the min_tokens mask, and logprobs with the most alternatives allowed."""
    history = list(range(min(vocab_size, 8)))
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=MAX_LOGPROBS),
        SamplingParams(
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            min_p=0.05,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            logprobs=MAX_LOGPROBS,
            seed=0,
            logit_bias=((history[-1], 0.5),),
        ),
        SamplingParams(temperature=1.0, min_tokens=4, eos_token_ids=(0,), logprobs=0),
    ]
    return [SamplingRow(kinds[i % len(kinds)], history, history[:3]) for i in range(num_rows)]


@torch.inference_mode()
def run_worst_step(
    model: torch.nn.Module,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    num_tokens: int,
    max_num_seqs: int,
    block_size: int,
    device: torch.device,
) -> None:
    """A prefill of `num_tokens` (the KV caches must hold them), then logits and the sampler
    for `max_num_seqs` rows. Every rank must call it: the logits gather is collective."""
    num_blocks = -(-num_tokens // block_size)
    metadata = build_attention_metadata(
        [num_tokens], [num_tokens], [list(range(num_blocks))], block_size, device
    )
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    positions = torch.arange(num_tokens, device=device)
    hidden = model(ids, positions, kv_caches, metadata)  # [T, H]
    rows = torch.arange(max_num_seqs, device=device) % num_tokens
    logits = model.compute_logits(hidden[rows])  # [max_num_seqs, V] on rank 0
    if logits is not None:
        sample(logits, sampler_rows(max_num_seqs, logits.shape[1]))


def packed_qkv(
    num_tokens: int, shape: AttentionShape, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and value as the model hands them to the backend: views of one packed
    projection, so the kernels see the strides they will see when serving."""
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, device=device).to(dtype)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return (
        q.view(num_tokens, shape.num_heads, shape.head_dim),
        k.view(num_tokens, shape.num_kv_heads, shape.head_dim),
        v.view(num_tokens, shape.num_kv_heads, shape.head_dim),
    )


def split_count_classes(max_splits: int) -> list[int]:
    """One split count per compiled reduce variant (the reduce kernel specialises on the
    next power of two of the count): 2, 4, ..., up to the count the heuristic allows."""
    counts, count = [], 2
    while count < max_splits * 2:
        counts.append(min(count, max_splits))
        count *= 2
    return counts


def attention_variants(
    k_cache: torch.Tensor,  # [N, BS, Hkv, D], one layer's real cache
    v_cache: torch.Tensor,
    shape: AttentionShape,
) -> dict[str, Callable[[], object]]:
    """A call per kernel variant the `triton` backend can launch for each of the layers'
    masks, on tiny batches in the first blocks of the real cache (whose contents are garbage
    until a sequence writes them). Sequence 0 is a 2-token chunk, sequence 1 a decode: one
    prefill launch covers both."""
    from pagedserve import kernels
    from pagedserve.kernels.paged_decode import MAX_SPLITS, paged_decode_attention
    from pagedserve.kernels.paged_prefill import build_work_items, paged_prefill_attention

    device, dtype = k_cache.device, k_cache.dtype
    scale = shape.head_dim**-0.5
    second_block = min(1, k_cache.shape[0] - 1)
    seq_lens, query_lens = [2, shape.block_size], [2, 1]
    metadata = build_attention_metadata(
        seq_lens, query_lens, [[0], [second_block]], shape.block_size, device
    )
    query, key, value = packed_qkv(3, shape, dtype, device)
    work_items = build_work_items(
        query_lens, seq_lens, shape.num_heads, shape.num_kv_heads, dtype, device
    )
    cache_args = (k_cache, v_cache, metadata.block_tables)
    decode_query = query[metadata.query_start_list[1] :]  # sequence 1's token
    decode_args = (decode_query, *cache_args[:2], metadata.block_tables[1:], metadata.seq_lens[1:])

    prefill = partial(
        paged_prefill_attention, query, *cache_args, metadata.query_start_loc,
        metadata.seq_lens, scale, work_items=work_items,
    )  # fmt: skip
    decode = partial(paged_decode_attention, *decode_args, scale,
                     max_seq_len=shape.block_size)  # fmt: skip
    variants: dict[str, Callable[[], object]] = {
        "kv write": lambda: kernels.write_kv_cache(
            key, value, k_cache, v_cache, metadata.slot_mapping
        ),
    }
    for masks in shape.layer_masks:
        options = masks.kernel_options(shape.num_heads, device)
        label = masks.label()
        variants[f"prefill{label}"] = partial(prefill, **options)
        variants[f"decode{label}"] = partial(decode, num_splits=1, **options)
        for num_splits in split_count_classes(MAX_SPLITS):
            variants[f"decode split {num_splits}{label}"] = partial(
                decode, num_splits=num_splits, **options
            )
    return variants


@torch.inference_mode()
def warm_up_experts(model: torch.nn.Module) -> dict[str, float]:
    """Each MoE layer shape's experts op at one step per tile class of the fused-MoE kernel
    (`kernels.fused_moe.warm_up_token_counts`): the memory profile's prefill compiles only
    the widest, and a decode step would compile its own variant inside a request. Layers of
    one shape share their variants (Triton keys them by dtype, top_k and tile sizes): the
    first of each shape runs. Returns the seconds each shape took."""
    from pagedserve.kernels.fused_moe import warm_up_token_counts
    from pagedserve.services.gpu_worker.layers.fused_moe import FusedMoE

    seconds: dict[str, float] = {}
    for layer in (m for m in model.modules() if isinstance(m, FusedMoE)):
        w13, top_k = layer.experts.w13_weight, layer.routing.top_k
        name = f"experts {tuple(w13.shape)} top {top_k}"
        if name in seconds:
            continue
        start = time.perf_counter()
        num_experts, hidden = w13.shape[0], w13.shape[2]
        for num_tokens in warm_up_token_counts(num_experts, top_k, w13.dtype):
            x = torch.zeros(num_tokens, hidden, dtype=w13.dtype, device=w13.device)
            ids = torch.arange(num_tokens * top_k, device=w13.device).view(-1, top_k) % num_experts
            weights = torch.full(ids.shape, 1 / top_k, dtype=w13.dtype, device=w13.device)
            layer.compute_experts(x, layer.experts, weights, ids, layer.act_and_mul)
        if w13.device.type == "cuda":
            torch.cuda.synchronize(w13.device)
        seconds[name] = time.perf_counter() - start
    logger.info("experts warm-up: %s", ", ".join(f"{n} {s:.2f}s" for n, s in seconds.items()))
    return seconds


def warm_up(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    shape: AttentionShape | None,
    vocab_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Run every kernel variant (when `shape` is given: the `triton` backend is in use) and
    the sampler once; returns the seconds each took, which on a GPU is mostly compiling."""
    calls = dict(attention_variants(*kv_caches[0], shape)) if shape is not None else {}
    logits = torch.randn(4, vocab_size, device=device)  # [4, V]: the sampler's float32 paths
    calls["sampler"] = lambda: sample(logits, sampler_rows(4, vocab_size))
    seconds: dict[str, float] = {}
    with torch.inference_mode():
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[name] = time.perf_counter() - start
    logger.info("warm-up: %s", ", ".join(f"{name} {secs:.2f}s" for name, secs in seconds.items()))
    return seconds
