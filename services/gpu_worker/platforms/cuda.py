"""The CUDA platform: bf16 (fp16 where the GPU lacks it), 16-token blocks, the KV cache sized
by a memory profile of the worst step, and every Triton kernel variant compiled before the
worker says it is ready."""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.kv_cache import num_blocks_for_bytes
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.services.gpu_worker.platforms.base import BasePlatform, KVCaches, KVSizing
from pagedserve.services.gpu_worker.platforms.memory_profile import reserved_bytes
from pagedserve.services.gpu_worker.warmup import (
    AttentionShape,
    run_worst_step,
    warm_up,
    warm_up_experts,
)


class CudaPlatform(BasePlatform):
    device_type = "cuda"
    default_attention_backend = "triton"

    def set_up_process(self, rank: int, world_size: int) -> None:
        torch.cuda.set_device(self.device.index if self.device.index is not None else rank)

    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def prepare_model(self, model: BaseCausalLM, world_size: int) -> None:
        """Compile the fused-MoE kernel's variants for the model's experts (none: a dense
        model), before the memory profile and the attention warm-up."""
        warm_up_experts(model)

    @torch.inference_mode()
    def num_kv_blocks(self, sizing: KVSizing) -> int:
        """Run the worst step (`warmup.run_worst_step`: a prefill of the token budget and the
        sampler at max_num_seqs rows) on a throwaway cache; what the peak (at least the
        weights and the largest MoE layer's activations: `memory_profile`) leaves under the
        utilisation cap becomes KV cache."""
        layout = sizing.layout
        num_tokens = min(sizing.max_num_batched_tokens, sizing.max_model_len)
        kv_caches = layout.allocate(-(-num_tokens // layout.block_size), self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        run_worst_step(
            sizing.model, kv_caches, num_tokens, sizing.max_num_seqs, layout.block_size,
            self.device,
        )  # fmt: skip
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        throwaway = layout.allocated_bytes(kv_caches[0][0].shape[0])
        del kv_caches
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.device).total_memory
        reserved = reserved_bytes(sizing.model, num_tokens, peak - throwaway)
        budget = int(total * sizing.cache_config.gpu_memory_utilization) - reserved
        return num_blocks_for_bytes(budget, layout.block_bytes())

    def warm_up(
        self, kv_caches: KVCaches, attention: AttentionShape | None, vocab_size: int
    ) -> None:
        warm_up(kv_caches, attention, vocab_size, self.device)
