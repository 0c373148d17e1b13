from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.sampler import SamplingRow, sample
from pagedserve.services.gpu_worker.token_masks import apply_token_masks, banned_token_ids
from pagedserve.shared.protocol import SamplingParams, decode, encode


def test_a_word_is_banned_only_after_its_prefix_ends_the_output():
    words = [(5,), (1, 2, 3), (9, 4)]
    assert banned_token_ids(words, []) == [5]
    assert banned_token_ids(words, [7, 1, 2]) == [5, 3]
    assert banned_token_ids(words, [1, 2, 7]) == [5]
    assert banned_token_ids(words, [2]) == [5]  # a prefix longer than the output


def test_masks_touch_only_their_rows_and_keep_the_raw_logits():
    logits = torch.arange(12, dtype=torch.float32).reshape(2, 6)
    params = [
        SamplingParams(allowed_token_ids=(1, 3), bad_words_token_ids=((3,),)),
        SamplingParams(),
    ]
    masked = apply_token_masks(logits, params, [[], []])
    inf = float("-inf")
    assert masked[0].tolist() == [inf, 1.0, inf, inf, inf, inf]
    assert masked[1].tolist() == logits[1].tolist()
    assert logits[0].tolist() == [0, 1, 2, 3, 4, 5]


def test_sampler_reports_raw_logprobs_of_the_masked_pick():
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0]])
    params = SamplingParams(temperature=0.0, logprobs=0, bad_words_token_ids=((2,),))
    out = sample(logits, [SamplingRow(params, [0], [])])
    assert out.token_ids == [3]
    assert out.logprobs[0] == float(logits.log_softmax(-1)[0, 3])


def test_masks_cross_the_wire_as_tuples():
    params = SamplingParams(allowed_token_ids=(4, 5), bad_words_token_ids=((1, 2), (3,)))
    assert decode(encode(params)) == params


def test_block_copies_read_every_source_before_writing():
    from pagedserve.services.gpu_worker.kv_cache import copy_blocks

    caches = [(torch.arange(4.0).view(4, 1, 1, 1), 10 + torch.arange(4.0).view(4, 1, 1, 1))]
    copy_blocks(caches, [(1, 2), (2, 3)])  # 3 gets 2's content from before the step
    assert caches[0][0].flatten().tolist() == [0, 1, 1, 2]
    assert caches[0][1].flatten().tolist() == [10, 11, 11, 12]
