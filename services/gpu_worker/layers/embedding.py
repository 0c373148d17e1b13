"""Vocab-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary
(padded so the split is even)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.services.gpu_worker.layers.linear_method import PLAIN_LINEAR, BaseLinearMethod
from pagedserve.services.gpu_worker.parallel_state import (
    all_reduce,
    gather_last_dim_to_rank0,
    get_tp_rank,
    get_tp_world_size,
)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.vocab_size = vocab_size
        self.vocab_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.vocab_per_rank
        self.weight = nn.Parameter(torch.empty(self.vocab_per_rank, hidden_size))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        if loaded.shape[0] != self.vocab_size or loaded.shape[1] != param.shape[1]:
            raise ValueError(
                f"embedding: checkpoint has shape {tuple(loaded.shape)}, the model expects "
                f"({self.vocab_size}, {param.shape[1]})"
            )
        end = min(self.vocab_start + self.vocab_per_rank, self.vocab_size)
        param.data.zero_()
        param.data[: end - self.vocab_start].copy_(loaded[self.vocab_start : end])

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocabulary slice; `forward` gathers them on rank 0 only."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(vocab_size, hidden_size)
        self.linear_method: BaseLinearMethod = PLAIN_LINEAR  # a platform may swap it

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:  # [B, H] -> [B, V] | None
        logits = self.linear_method.apply(hidden, self.weight)
        full = gather_last_dim_to_rank0(logits)
        if full is None:
            return None
        return full[..., : self.vocab_size]
