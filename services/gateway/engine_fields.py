"""vLLM's request fields that steer the engine itself rather than sampling knobs: token masks
(`allowed_token_ids`, `bad_words`), a prefix-cache namespace (`cache_salt`) and beam search
(`use_beam_search`, `best_of`, `length_penalty`). Read here for shape; token ids against the
vocabulary and bad words through the tokenizer in `request_builder`."""

from __future__ import annotations

from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.request_fields import (
    BoolField,
    CustomField,
    Field,
    IntField,
    NumberField,
    is_int,
)
from pagedserve.shared.protocol import MAX_BEAM_WIDTH

MAX_ALLOWED_TOKEN_IDS = 1 << 17
MAX_BAD_WORDS = 256
MAX_BAD_WORD_CHARS = 256
LENGTH_PENALTY_LIMIT = 100.0


def _read_allowed_token_ids(body: dict[str, Any]) -> tuple[int, ...] | None:
    value = body.get("allowed_token_ids")
    if value is None:
        return None
    if not isinstance(value, list) or not all(is_int(v) and v >= 0 for v in value):
        raise bad_request("`allowed_token_ids` must be an array of non-negative integers",
                          "allowed_token_ids")  # fmt: skip
    if not value:
        raise bad_request("`allowed_token_ids` must not be empty", "allowed_token_ids")
    if len(value) > MAX_ALLOWED_TOKEN_IDS:
        raise bad_request(
            f"`allowed_token_ids` may hold at most {MAX_ALLOWED_TOKEN_IDS} ids, got {len(value)}",
            "allowed_token_ids",
        )
    return tuple(dict.fromkeys(value))


def _read_bad_words(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("bad_words")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise bad_request("`bad_words` must be an array of strings", "bad_words")
    if len(value) > MAX_BAD_WORDS:
        raise bad_request(
            f"`bad_words` may hold at most {MAX_BAD_WORDS} words, got {len(value)}", "bad_words"
        )
    for word in value:
        if not word.strip() or len(word) > MAX_BAD_WORD_CHARS:
            raise bad_request(
                f"each of `bad_words` must have 1 to {MAX_BAD_WORD_CHARS} characters and not "
                f"be only spaces, got {word!r}",
                "bad_words",
            )
    return tuple(value)


def _read_cache_salt(body: dict[str, Any]) -> str | None:
    value = body.get("cache_salt")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad_request("`cache_salt` must be a non-empty string if provided", "cache_salt")
    return value


ENGINE_FIELDS: tuple[Field, ...] = (
    CustomField("allowed_token_ids", _read_allowed_token_ids, {
        "type": "array", "minItems": 1, "maxItems": MAX_ALLOWED_TOKEN_IDS,
        "items": {"type": "integer", "minimum": 0}, "nullable": True,
    }),
    CustomField("bad_words", _read_bad_words, {
        "type": "array", "maxItems": MAX_BAD_WORDS,
        "items": {"type": "string", "minLength": 1, "maxLength": MAX_BAD_WORD_CHARS},
    }),
    CustomField("cache_salt", _read_cache_salt,
                {"type": "string", "minLength": 1, "nullable": True}),
    BoolField("use_beam_search"),
    IntField("best_of", 1, MAX_BEAM_WIDTH),
    NumberField("length_penalty", -LENGTH_PENALTY_LIMIT, LENGTH_PENALTY_LIMIT, 1.0),
)  # fmt: skip
ENGINE = {f.name: f for f in ENGINE_FIELDS}


def read_beam_width(body: dict[str, Any], n: int, logprobs: int | None) -> int:
    """Beams of a beam search (`best_of`, else `n`); 0 without `use_beam_search`. A 400
    names what cannot be combined with it."""
    use_beam_search = ENGINE["use_beam_search"].read(body)
    best_of = ENGINE["best_of"].read(body)
    length_penalty = ENGINE["length_penalty"].read(body)
    if not use_beam_search:
        if best_of not in (None, n):
            raise bad_request("`best_of` differs from `n` only with `use_beam_search`", "best_of")
        if length_penalty != 1.0:
            raise bad_request("`length_penalty` applies only with `use_beam_search`",
                              "length_penalty")  # fmt: skip
        return 0
    width = n if best_of is None else best_of
    if not n <= width <= MAX_BEAM_WIDTH:
        raise bad_request(
            f"beam search needs `n` ({n}) <= beams (`best_of` or `n`: {width}) <= {MAX_BEAM_WIDTH}",
            "best_of" if best_of is not None else "n",
        )
    if logprobs is not None:
        raise bad_request("`logprobs` cannot be combined with `use_beam_search`", "logprobs")
    for name in ("allowed_token_ids", "bad_words", "logit_bias"):
        if body.get(name):
            raise bad_request(f"`{name}` cannot be combined with `use_beam_search`", name)
    return width


def bad_words_token_ids(words: tuple[str, ...], tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of `bad_words`: each word as it is (without leading spaces), and
    with one leading space when that makes a different first token of the same length."""
    token_ids: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        token_ids.append(bare)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            token_ids.append(spaced)
    return tuple(tuple(ids) for ids in token_ids if ids)
