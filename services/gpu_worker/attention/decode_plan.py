"""What a decode batch's attention needs that is the same in all layers, derived once a step.

On a CPU a decode step at small batch is bound by the number of torch calls as much as by
arithmetic (each costs several microseconds, and 30 layers repeat them). The length-sorted
groups, each group's cache block ids and its mask of visible keys depend only on the step's metadata
and the cache's block size, so the torch backend plans them in the first layer and every other
layer reuses the plan (`AttentionMetadata.backend_scratch`).

Groups: with long-tailed context lengths, padding every sequence to the longest costs several
times the real work (gathers and matmuls are proportional to the padded length), so a batch is
split into at most `MAX_DECODE_GROUPS` length-sorted groups, each padded to its own longest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_DECODE_GROUPS = 4


@dataclass(slots=True, frozen=True)
class DecodeGroup:
    """Some sequences of a decode batch, attended together."""

    rows: torch.Tensor | None  # [G] int64: their rows in the batch; None: all, in order
    block_ids: torch.Tensor  # [G * blocks] int64: the cache blocks holding their contexts
    num_seqs: int
    max_len: int  # the group's longest context: every sequence is padded to it
    visible: torch.Tensor | None  # [G, 1, 1, max_len] bool, False past a context; None: all


def plan_decode_groups(
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    lens: list[int],  # seq_lens as a list
    block_size: int,
) -> list[DecodeGroup]:
    """The batch as one group, or as length-sorted groups when lengths differ widely."""
    batch = len(lens)
    if batch < 2 * MAX_DECODE_GROUPS or max(lens) <= 2 * min(lens):
        return [plan_group(None, block_tables, seq_lens, max(lens), block_size)]
    order = sorted(range(batch), key=lens.__getitem__)
    group_size = -(-batch // MAX_DECODE_GROUPS)
    groups = []
    for start in range(0, batch, group_size):
        rows = order[start : start + group_size]
        index = torch.tensor(rows, device=block_tables.device)
        groups.append(
            plan_group(index, block_tables[index], seq_lens[index], lens[rows[-1]], block_size)
        )
    return groups


def plan_group(
    rows: torch.Tensor | None,
    block_tables: torch.Tensor,  # [G, max_blocks] the group's own rows
    seq_lens: torch.Tensor,  # [G]
    max_len: int,
    block_size: int,
) -> DecodeGroup:
    num_blocks = -(-max_len // block_size)
    block_ids = block_tables[:, :num_blocks].reshape(-1).long()
    visible = None
    if int(seq_lens.min()) < max_len:
        positions = torch.arange(max_len, device=seq_lens.device)
        visible = (positions[None, :] < seq_lens[:, None].long())[:, None, None, :]
    return DecodeGroup(rows, block_ids, int(seq_lens.shape[0]), max_len, visible)


def gather_group(cache: torch.Tensor, group: DecodeGroup) -> torch.Tensor:
    """The group's cached tokens in position order, [G, max_len, Hkv, D] (as
    `kernels.reference.gather_kv`, with the block ids already taken)."""
    num_blocks, _, num_kv_heads, head_dim = cache.shape
    blocks = cache.reshape(num_blocks, -1).index_select(0, group.block_ids)
    return blocks.view(group.num_seqs, -1, num_kv_heads, head_dim)[:, : group.max_len]
