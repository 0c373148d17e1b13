"""Which drafts the workers keep (services/gpu_worker/speculation.py)."""

from __future__ import annotations

import pytest

from services.gpu_worker.speculation import accepted


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
