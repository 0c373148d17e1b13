"""Which drafts the workers keep (services/gpu_worker/speculation.py)."""

from __future__ import annotations

import pytest

from services.gpu_worker.sequence_state import SequenceState
from services.gpu_worker.speculation import accepted
from shared.protocol import SamplingParams


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
