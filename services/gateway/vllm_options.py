"""vLLM's extra request parameters beyond OpenAI's, validated: each one accepted here is
honoured downstream (request_builder, output_processor, response_formatter), each with the
meaning vLLM gives it.

- `echo` (completions: the prompt before the completion, with its logprobs when `logprobs`
  is set; chat: the last message's content when it is the assistant's)
- `prompt_logprobs` (log-softmax of every prompt token and its top k; not with `stream`)
- `return_token_ids` (prompt and completion token ids in the response)
- `skip_special_tokens`, `include_stop_str_in_output`, `truncate_prompt_tokens`
- `stream_options.continuous_usage_stats` (usage in every chunk)
- `logit_bias` (OpenAI's: token id -> bias in [-100, 100])
- `continue_final_message`, `chat_template_kwargs` (chat templates)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.shared.request_bounds import LOGIT_BIAS_LIMIT, MAX_PROMPT_LOGPROBS
from pagedserve.shared.value_checks import is_int

MAX_LOGIT_BIAS_ENTRIES = 1024
# vLLM parameters this server cannot honour: refused (400 naming them) unless sent with the
# value that means "off", so that nobody believes they took effect.
REFUSED_UNLESS_OFF: dict[str, tuple[Any, str]] = {
    "use_beam_search": (False, "beam search is not implemented"),
    "length_penalty": (1.0, "it only applies to beam search, which is not implemented"),
    "bad_words": ([], "bad-word banning is not implemented (logit_bias bans single tokens)"),
    "allowed_token_ids": (None, "it is not implemented (logit_bias can steer tokens)"),
    "return_tokens_as_token_ids": (False, "logprob tokens are always shown as text"),
    "spaces_between_special_tokens": (True, "the fast tokenizers decode only this way"),
    "prompt_embeds": (None, "prompts are token ids or text only"),
    "lora_request": (None, "LoRA adapters are not supported"),
    "logits_processors": (None, "custom logits processors are not supported"),
    "cache_salt": (None, "the prefix cache is shared by every request"),
}
# chat_template_kwargs may not override what the gateway itself passes to the template
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tokenize", "return_dict", "chat_template", "tools"}
)


@dataclass(frozen=True)
class OutputOptions:
    """How the output is shown (and the prompt cut), as vLLM's extra parameters ask."""

    echo: bool = False
    prompt_logprobs: int | None = None  # shown to the client; None: not asked for
    return_token_ids: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    add_special_tokens: bool | None = None  # None: the endpoint's default (vLLM's)
    continuous_usage_stats: bool = False
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens; -1: the limit


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"`{name}` must be a boolean", name)
    return value


def read_prompt_logprobs(body: dict[str, Any], stream: bool) -> int | None:
    value = body.get("prompt_logprobs")
    if value is None:
        return None
    if not is_int(value) or not 0 <= value <= MAX_PROMPT_LOGPROBS:
        raise bad_request(
            f"`prompt_logprobs` must be an integer >= 0 and <= {MAX_PROMPT_LOGPROBS}, "
            f"got {value!r}",
            "prompt_logprobs",
        )
    if stream:
        raise bad_request("`prompt_logprobs` is not available when `stream` is true (as vLLM)",
                          "prompt_logprobs")  # fmt: skip
    return value


def _truncate_prompt_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    if not is_int(value) or value == 0 or value < -1:
        raise bad_request(
            f"`truncate_prompt_tokens` must be -1 (the model's limit) or >= 1, got {value!r}",
            "truncate_prompt_tokens",
        )
    return value


def _continuous_usage_stats(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if not isinstance(options, dict):
        return False  # its shape is checked with `include_usage`
    return _bool(options, "continuous_usage_stats", False)


def refuse_unsupported_vllm_options(body: dict[str, Any]) -> None:
    for name, (off, reason) in REFUSED_UNLESS_OFF.items():
        value = body.get(name)
        if value is not None and value != off and value != []:
            raise bad_request(f"`{name}` is not supported by this server: {reason}", name)


def read_output_options(body: dict[str, Any], stream: bool) -> OutputOptions:
    refuse_unsupported_vllm_options(body)
    return OutputOptions(
        add_special_tokens=(
            None
            if body.get("add_special_tokens") is None
            else _bool(body, "add_special_tokens", True)
        ),
        echo=_bool(body, "echo", False),
        prompt_logprobs=read_prompt_logprobs(body, stream),
        return_token_ids=_bool(body, "return_token_ids", False),
        skip_special_tokens=_bool(body, "skip_special_tokens", True),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False),
        continuous_usage_stats=_continuous_usage_stats(body),
        truncate_prompt_tokens=_truncate_prompt_tokens(body),
    )


def read_logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}`; ids are checked against the vocabulary later."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request("`logit_bias` must be an object mapping token ids to numbers",
                          "logit_bias")  # fmt: skip
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(
            f"`logit_bias` may hold at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(value)}",
            "logit_bias",
        )
    pairs = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise bad_request(f"`logit_bias` keys must be token ids, got {key!r}", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not math.isfinite(bias):
            raise bad_request(f"`logit_bias[{key}]` must be a number", "logit_bias")
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise bad_request(
                f"`logit_bias[{key}]` must be >= {-LOGIT_BIAS_LIMIT:g} and "
                f"<= {LOGIT_BIAS_LIMIT:g}, got {bias}",
                "logit_bias",
            )
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


def read_chat_template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise bad_request("`chat_template_kwargs` must be an object", "chat_template_kwargs")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(value))
    if reserved:
        raise bad_request(
            f"`chat_template_kwargs` may not set {reserved}: the server sets them",
            "chat_template_kwargs",
        )
    return dict(value)


def read_continue_final_message(body: dict[str, Any], add_generation_prompt: bool) -> bool:
    value = _bool(body, "continue_final_message", False)
    if value and add_generation_prompt:
        raise bad_request(
            "`continue_final_message` and `add_generation_prompt` cannot both be true "
            "(set `add_generation_prompt` to false to continue the last message)",
            "continue_final_message",
        )
    return value
