"""Refusals before tokenizing: the size bound is a true lower bound, and what it refuses gets
the same 400 as a prompt found too long after tokenizing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pagedserve.services.gateway.admission import check_num_sequences, check_text_fits
from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.token_bound import max_bytes_per_token, min_num_tokens
from tests.unit.gateway.helpers import load_test_tokenizer


def test_the_default_tokenizers_longest_token() -> None:
    info = load_test_tokenizer()
    # Byte-level BPE: its longest token is 80 spaces after a newline, 81 bytes.
    assert info.max_bytes_per_token == 81


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=400) | st.sampled_from([" " * 2000, "\n" * 999, "ab" * 600]))
def test_the_bound_never_exceeds_the_real_token_count(text: str) -> None:
    info = load_test_tokenizer()
    assert info.max_bytes_per_token is not None
    num_tokens = len(info.tokenizer.encode(text, add_special_tokens=False))
    assert min_num_tokens(text, info.max_bytes_per_token, info.vanishing_chars) <= num_tokens


def test_characters_the_tokenizer_drops_are_not_counted() -> None:
    info = load_test_tokenizer()
    assert "\x1d" in info.vanishing_chars and "a" not in info.vanishing_chars
    assert info.tokenizer.encode("\x1d" * 5, add_special_tokens=False) == []
    assert min_num_tokens("\x1d" * 5, 81, info.vanishing_chars) == 0
    assert min_num_tokens("a\x1d", 81, info.vanishing_chars) == 1


def _word_level(normalizer: normalizers.Normalizer | None) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_a_normalizer_that_can_shorten_text_gives_no_bound() -> None:
    assert max_bytes_per_token(_word_level(normalizers.Strip())) is None
    shrinking = normalizers.Replace("  ", " ")
    assert max_bytes_per_token(_word_level(shrinking)) is None
    assert max_bytes_per_token(_word_level(None)) == len("[UNK]")
    assert max_bytes_per_token(_word_level(normalizers.NFC())) == 3 * len("[UNK]")


def test_text_that_cannot_fit_is_refused_like_a_long_prompt() -> None:
    with pytest.raises(APIError) as caught:
        check_text_fits("x" * 81_000, bytes_per_token=81, max_model_len=1000, max_tokens=None)
    assert caught.value.status == 400 and caught.value.param == "prompt"
    assert "at least 1000 tokens" in caught.value.message
    assert "maximum context length of 1000 tokens" in caught.value.message


def test_max_tokens_beyond_the_model_alone_is_refused() -> None:
    with pytest.raises(APIError) as caught:
        check_text_fits(
            "x" * 81_000, 81, 2000, max_tokens=2001, max_tokens_param="max_completion_tokens"
        )
    assert caught.value.param == "max_completion_tokens"
    # 1000 + 1001 does not fit, but max_tokens alone does: the output is capped (vLLM)
    check_text_fits("x" * 81_000, 81, 2000, max_tokens=1001)
    check_text_fits("x" * 10**7, None, 100, max_tokens=None)  # no bound: tokenizing decides


def test_a_small_text_is_left_to_the_exact_count() -> None:
    """Tokenizing it is cheap, and the exact count makes the better error message."""
    check_text_fits("x" * 8100, bytes_per_token=81, max_model_len=100, max_tokens=None)


def test_sequences_per_request() -> None:
    check_num_sequences(16, 16, 256)
    with pytest.raises(APIError) as caught:
        check_num_sequences(64, 16, 256)
    assert caught.value.param == "n"
    assert "64 prompt(s) x n=16 = 1024 sequences; the limit is 256" in caught.value.message
