"""The request bounds are written once (shared/request_bounds.py); every layer enforces the
same number."""

from __future__ import annotations

import pytest

from pagedserve.shared.protocol import SamplingParams
from pagedserve.shared.request_bounds import INT64_MAX, INT64_MIN, MAX_LOGPROBS
from pagedserve.shared.value_checks import is_finite_number, is_int


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_the_engine_takes_logprobs_up_to_the_bound_and_names_it_beyond(field: str) -> None:
    SamplingParams(**{field: MAX_LOGPROBS}).validate()
    with pytest.raises(ValueError, match=rf"{field} must be in \[0, {MAX_LOGPROBS}\]"):
        SamplingParams(**{field: MAX_LOGPROBS + 1}).validate()


def test_int64_is_the_seed_range_of_the_gateway_and_the_engine() -> None:
    from pagedserve.services.gateway.field_table import SEED_MAX, SEED_MIN

    assert (SEED_MIN, SEED_MAX) == (INT64_MIN, INT64_MAX) == (-(2**63), 2**63 - 1)


def test_a_bool_is_not_an_int_nor_a_number() -> None:
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_finite_number(2.5) and is_finite_number(2)
    assert not is_finite_number(False) and not is_finite_number(float("inf"))
