"""Which drafts the workers keep (services/gpu_worker/speculation.py)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.sequence_state import SequenceState
from pagedserve.services.gpu_worker.speculation import accepted, verify_drafts
from pagedserve.shared.protocol import SamplingParams, StepResult


@pytest.mark.parametrize(
    ("drafts", "first", "after", "want"),
    [
        ([5, 6, 7], 5, [6, 7, 8], [6, 7, 8]),  # all kept, and the token after the last
        ([5, 6, 7], 5, [6, 9, 8], [6, 9]),  # 7 != 9: the token sampled after 6 ends it
        ([5, 6, 7], 4, [6, 7, 8], []),  # the first draft is wrong: only `first` is output
        ([5], 5, [2], [2]),
    ],
)
def test_accepted(drafts, first, after, want):
    assert accepted(drafts, first, after) == want


def test_drafts_must_follow_exactly_one_known_token():
    state = SequenceState("s", [1, 2, 3], 2, [0], SamplingParams(temperature=0.0))
    state.num_computed_tokens, state.num_scheduled_tokens = 1, 4  # 2 known tokens + 2 drafts
    state.draft_token_ids = [4, 5]
    with pytest.raises(ValueError, match="2 drafts must be computed with the one known token"):
        state.validate(block_size=8, max_model_len=64)
    state.num_computed_tokens, state.num_scheduled_tokens = 2, 3
    state.validate(block_size=8, max_model_len=64)
    assert state.scheduled_token_ids() == [3, 4, 5] and state.is_sampled


EOS = 7


def test_draft_rows_short_of_min_tokens_cannot_sample_eos():
    """Each draft's row is sampled with the outputs that draft implies: EOS is masked after a
    draft that leaves the sequence short of min_tokens, and allowed after one that does not."""
    sampling = SamplingParams(temperature=0.0, min_tokens=3, eos_token_ids=(EOS,))
    state = SequenceState("s", [1, 2, 3, 4], 3, [0], sampling)  # one output so far: 4
    state.draft_token_ids = [5, 6]
    draft_logits = torch.zeros(2, 8)
    draft_logits[:, EOS] = 10.0  # EOS is every row's best token ...
    draft_logits[0, 6] = 5.0  # ... then 6 after draft 5 (2 outputs: EOS still masked)
    result = StepResult(step_id=1, seq_ids=["s"], token_ids=[5])  # sampled after 4: 5
    checked = verify_drafts(result, draft_logits, [state])
    # 5 == 5 keeps draft 5, 6 is sampled after it; 6 == 6 keeps draft 6, EOS follows it
    assert checked.more_token_ids == [[6, EOS]]
