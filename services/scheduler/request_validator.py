"""The engine's last line of defence: every request is checked before it is queued, whoever
wrote it into Redis. The gateway validates what clients send, with user-facing messages; this
makes sure that no entry (a bug, an old gateway, a hand-written XADD) can crash a step or hurt
the requests batched with it. A bad request is rejected with a message naming what is wrong.
"""

from __future__ import annotations

import dataclasses

from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.shared.protocol import GenerateRequest, SamplingParams
from pagedserve.shared.request_bounds import INT64_MAX, INT64_MIN
from pagedserve.shared.value_checks import is_finite_number, is_int


def _type_problem(name: str, kind: str, value: object) -> str | None:
    """What is wrong with `value` for a field declared as `kind` (None: fine, or a kind this
    check does not know, left to the field's own validation)."""
    optional = kind.endswith(" | None")
    if optional and value is None:
        return None
    kind = kind.removesuffix(" | None")
    if kind == "float" and not is_finite_number(value):
        return f"{name} must be a finite number, got {value!r}"
    if kind == "int" and not (is_int(value) and INT64_MIN <= value <= INT64_MAX):  # type: ignore[operator]
        return f"{name} must be a 64-bit integer, got {value!r}"
    if kind == "bool" and not isinstance(value, bool):
        return f"{name} must be a boolean, got {value!r}"
    if kind == "tuple[int, ...]" and not (
        isinstance(value, tuple) and all(is_int(v) for v in value)
    ):
        return f"{name} must be a list of integers, got {value!r}"
    if kind == "tuple[tuple[int, ...], ...]" and not (
        isinstance(value, tuple)
        and all(isinstance(v, tuple) and all(is_int(t) for t in v) for v in value)
    ):
        return f"{name} must be a list of lists of integers, got {value!r}"
    return None


def _sampling_problems(sampling: SamplingParams, vocab_size: int) -> list[str]:
    problems = []
    for field in dataclasses.fields(sampling):
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
        problem = _type_problem(field.name, kind, getattr(sampling, field.name))
        if problem is not None:
            problems.append(problem)
    if problems:
        return problems
    try:
        sampling.validate()
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    if vocab_size > 0:
        biased = tuple(t for t, _ in sampling.logit_bias)
        checked = (
            ("stop_token_ids", sampling.stop_token_ids),
            ("eos_token_ids", sampling.eos_token_ids),
            ("logit_bias", biased),
            ("allowed_token_ids", sampling.allowed_token_ids or ()),
            ("bad_words", tuple(t for word in sampling.bad_words_token_ids for t in word)),
        )
        for name, ids in checked:
            outside = [t for t in ids if not 0 <= t < vocab_size]
            if outside:
                problems.append(
                    f"{name} {outside[:5]} are outside the vocabulary [0, {vocab_size})"
                )
    return problems


def validate_request(request: GenerateRequest, vocab_size: int) -> None:
    """Raise `RequestRejectedError` naming what is wrong with `request`'s fields: their types,
    its prompt's token ids (`vocab_size` > 0: each must be below it) and sampling parameters.
    Lengths against the engine's limits: `check_fits`."""
    rid = request.request_id
    prompt = request.prompt_token_ids
    if not isinstance(prompt, list) or not all(is_int(t) for t in prompt):
        raise RequestRejectedError(f"request {rid!r}: prompt_token_ids must be a list of integers")
    if vocab_size > 0:
        outside = [t for t in prompt if not 0 <= t < vocab_size]
        if outside:
            raise RequestRejectedError(
                f"request {rid!r}: prompt token ids {outside[:5]} are outside the vocabulary "
                f"[0, {vocab_size})"
            )
    elif any(t < 0 for t in prompt):
        raise RequestRejectedError(f"request {rid!r}: prompt token ids must be >= 0")
    if not is_int(request.priority):
        raise RequestRejectedError(f"request {rid!r}: priority must be an integer")
    if request.sample_group is not None and not isinstance(request.sample_group, str):
        raise RequestRejectedError(f"request {rid!r}: sample_group must be a string")
    salt = request.cache_salt
    if salt is not None and not (isinstance(salt, str) and salt):
        raise RequestRejectedError(f"request {rid!r}: cache_salt must be a non-empty string")
    if not isinstance(request.sampling, SamplingParams):
        raise RequestRejectedError(f"request {rid!r}: sampling is not a SamplingParams")
    problems = _sampling_problems(request.sampling, vocab_size)
    if problems:
        raise RequestRejectedError(
            f"request {rid!r}: invalid sampling params: {'; '.join(problems)}"
        )


def check_fits(
    request: GenerateRequest, max_model_len: int, block_size: int, num_blocks: int
) -> None:
    """Raise `RequestRejectedError` if `request` (already validated) could never run on an
    engine of this size: an empty prompt, or prompt + max_tokens beyond the length limit or
    the whole KV cache."""
    rid = request.request_id
    num_prompt = len(request.prompt_token_ids)
    if num_prompt == 0:
        raise RequestRejectedError(f"request {rid!r}: the prompt is empty")
    max_tokens = request.sampling.max_tokens
    if num_prompt + max_tokens > max_model_len:
        raise RequestRejectedError(
            f"request {rid!r}: prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) "
            f"exceeds max_model_len ({max_model_len})"
        )
    num_needed = -(-(num_prompt + max_tokens) // block_size)
    if num_needed > num_blocks:
        raise RequestRejectedError(
            f"request {rid!r}: prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) "
            f"needs {num_needed} KV blocks of {block_size} tokens but the whole cache "
            f"has {num_blocks}"
        )


def check_beam_fits(
    request: GenerateRequest, max_num_seqs: int, block_size: int, num_blocks: int
) -> None:
    """Raise `RequestRejectedError` if `request`'s beams could not all run at once here: more
    beams than `max_num_seqs`, or more blocks than the cache holds were no block shared (so
    that a beam search alone can always finish, whatever its beams share)."""
    width = request.sampling.beam_width
    if not width:
        return
    rid = request.request_id
    if width > max_num_seqs:
        raise RequestRejectedError(
            f"request {rid!r}: beam search with {width} beams exceeds max_num_seqs ({max_num_seqs})"
        )
    num_tokens = len(request.prompt_token_ids) + request.sampling.max_tokens
    num_needed = width * -(-num_tokens // block_size)
    if num_needed > num_blocks:
        raise RequestRejectedError(
            f"request {rid!r}: {width} beams of up to {num_tokens} tokens may need "
            f"{num_needed} KV blocks of {block_size} tokens but the whole cache has {num_blocks}"
        )
