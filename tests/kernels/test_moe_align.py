"""kernels/moe_align.py: (token, choice) pairs sorted by expert, each expert padded to whole
blocks, every block naming its expert, nothing read back to the host."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.moe_align import align_pairs, max_padded_rows


def test_the_docstring_example():
    aligned = align_pairs(torch.tensor([[2, 0], [2, 1]]), num_experts=3, block_m=4)
    assert aligned.sorted_pairs.tolist() == [1, 4, 4, 4, 3, 4, 4, 4, 0, 2, 4, 4, 4, 4, 4, 4]
    assert aligned.block_experts.tolist() == [0, 1, 2, -1]
    assert aligned.num_padded.tolist() == [12]


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "block_m"),
                         [(1, 1, 4, 16), (5, 2, 8, 4), (37, 4, 8, 16), (70, 2, 4, 16),
                          (16, 2, 8, 16), (3, 2, 64, 16)])  # fmt: skip
def test_every_pair_once_in_its_experts_blocks(num_tokens, top_k, num_experts, block_m):
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack(
        [torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]
    )
    aligned = align_pairs(ids, num_experts, block_m)
    num_pairs = num_tokens * top_k
    rows = aligned.sorted_pairs.view(-1, block_m)
    assert rows.shape[0] == aligned.block_experts.shape[0]
    assert rows.numel() == max_padded_rows(num_pairs, num_experts, block_m)
    flat = ids.reshape(-1)
    seen = []
    for block, expert in zip(rows.tolist(), aligned.block_experts.tolist(), strict=True):
        pairs = [p for p in block if p != num_pairs]
        if expert < 0:
            assert not pairs  # past the padded end: padding only
            continue
        assert all(flat[p] == expert for p in pairs)
        assert pairs == sorted(pairs)
        seen += pairs
    assert sorted(seen) == list(range(num_pairs))
    counts = torch.bincount(flat, minlength=num_experts)
    assert int(aligned.num_padded) == int(((counts + block_m - 1) // block_m * block_m).sum())
    # the padded end is where the named blocks stop
    named = int((aligned.block_experts >= 0).sum())
    assert named * block_m == int(aligned.num_padded)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"\[tokens, top_k\]"):
        align_pairs(torch.zeros(4, dtype=torch.long), 4, 16)
    with pytest.raises(ValueError, match="block_m must be at least 1"):
        align_pairs(torch.zeros(2, 2, dtype=torch.long), 4, 0)
