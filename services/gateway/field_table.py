"""Every request field the gateway reads, with its bounds, written once: `openai_schema` and
`vllm_options` read bodies through these fields, and `openapi_document` describes the same
fields, so /openapi.json states exactly what the validator enforces.

Fields that need the tokenizer (prompt length against the model length, token ids against
the vocabulary) are checked when the request is built (`request_builder`). The structured
output forms (`response_format`, `structured_outputs`, `guided_*`, `tools`) have their own
readers (`structured_outputs`, `tool_calls`) and are not described in the document.
"""

from __future__ import annotations

import math
from typing import Any

from pagedserve.services.gateway.chat_messages import MESSAGES_SCHEMA, read_messages
from pagedserve.services.gateway.engine_fields import ENGINE_FIELDS
from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.request_fields import (
    BoolField,
    CustomField,
    Field,
    IntField,
    NumberField,
    StringField,
)
from pagedserve.shared.request_bounds import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    LOGIT_BIAS_LIMIT,
    MAX_LOGPROBS,
    MAX_PROMPT_LOGPROBS,
)
from pagedserve.shared.value_checks import is_int

MAX_N = 16  # choices per request
MAX_BATCH_PROMPTS = 64  # prompts in one /v1/completions call
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
SEED_MIN, SEED_MAX = INT64_MIN, INT64_MAX  # any int64, as OpenAI and vLLM accept
PRIORITY_LIMIT = -INT32_MIN
MAX_LOGIT_BIAS_ENTRIES = 1024
# chat_template_kwargs may not override what the gateway itself passes to the template
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tokenize", "return_dict", "chat_template", "tools"}
)


def _read_stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("`stop` must be a string or an array of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(
            f"`stop` may hold at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop"
        )
    for stop in stops:
        if not 1 <= len(stop) <= MAX_STOP_STRING_CHARS:
            raise bad_request(
                f"each `stop` string must have 1 to {MAX_STOP_STRING_CHARS} characters, "
                f"got {len(stop)}",
                "stop",
            )
    return tuple(dict.fromkeys(stops))


def _read_stop_token_ids(body: dict[str, Any]) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(is_int(v) and v >= 0 for v in value):
        raise bad_request(
            "`stop_token_ids` must be an array of non-negative integers", "stop_token_ids"
        )
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise bad_request(
            f"`stop_token_ids` may hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(value)}",
            "stop_token_ids",
        )
    return tuple(value)


def _read_logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
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
                f"`logit_bias[{key}]` must be >= {-LOGIT_BIAS_LIMIT} and <= {LOGIT_BIAS_LIMIT}, "
                f"got {bias}",
                "logit_bias",
            )
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


def _read_stream_options(body: dict[str, Any]) -> dict[str, bool]:
    """{"include_usage", "continuous_usage_stats"}, only with `stream`."""
    options = body.get("stream_options")
    if options is None:
        return {"include_usage": False, "continuous_usage_stats": False}
    if not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object", "stream_options")
    if body.get("stream") is not True:
        raise bad_request(
            "`stream_options` is only allowed when `stream` is true", "stream_options"
        )
    return {name: STREAM_OPTION_FIELDS[name].read(options) for name in STREAM_OPTION_FIELDS}


def _read_prompt_logprobs(body: dict[str, Any]) -> int | None:
    value = PROMPT_LOGPROBS_BOUND.read(body)
    if value is not None and body.get("stream") is True:
        raise bad_request("`prompt_logprobs` is not available when `stream` is true (as vLLM)",
                          "prompt_logprobs")  # fmt: skip
    return value


def _read_truncate_prompt_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    if not is_int(value) or value == 0 or value < -1:
        raise bad_request(
            f"`truncate_prompt_tokens` must be -1 (the model's limit) or >= 1, got {value!r}",
            "truncate_prompt_tokens",
        )
    return value


def _read_chat_template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
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


def _read_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    prompt = body.get("prompt")
    error = bad_request(
        "`prompt` must be a string, an array of token ids, or an array of either", "prompt"
    )
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise error
    if len(prompts) > MAX_BATCH_PROMPTS:
        raise bad_request(
            f"`prompt` may hold at most {MAX_BATCH_PROMPTS} prompts, got {len(prompts)}", "prompt"
        )
    for item in prompts:
        is_ids = isinstance(item, list) and all(is_int(t) for t in item)
        if not (isinstance(item, str) or is_ids):
            raise error
        if len(item) == 0:
            raise bad_request("`prompt` must not be empty", "prompt")
    return prompts


_STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_LOGPROBS_BOUND = IntField("prompt_logprobs", 0, MAX_PROMPT_LOGPROBS)
STREAM_OPTION_FIELDS = {
    "include_usage": BoolField("include_usage"),
    "continuous_usage_stats": BoolField("continuous_usage_stats"),
}

# Both endpoints: sampling, streaming and vLLM's output options.
COMMON_FIELDS: tuple[Field, ...] = (
    StringField("model"),
    IntField("max_tokens", 0, INT32_MAX),
    NumberField("temperature", 0.0, 2.0, 1.0),
    NumberField("top_p", 0.0, 1.0, 1.0, low_open=True),
    IntField("top_k", -1, INT32_MAX, -1),
    NumberField("min_p", 0.0, 1.0, 0.0),
    NumberField("presence_penalty", -2.0, 2.0, 0.0),
    NumberField("frequency_penalty", -2.0, 2.0, 0.0),
    NumberField("repetition_penalty", 0.0, 2.0, 1.0, low_open=True),
    IntField("seed", SEED_MIN, SEED_MAX),
    CustomField("stop", _read_stop, {
        "oneOf": [_STOP_STRING,
                  {"type": "array", "maxItems": MAX_STOP_STRINGS, "items": _STOP_STRING}],
        "nullable": True,
    }),
    CustomField("stop_token_ids", _read_stop_token_ids, {
        "type": "array", "maxItems": MAX_STOP_TOKEN_IDS, "items": {"type": "integer", "minimum": 0},
    }),
    BoolField("ignore_eos"),
    IntField("min_tokens", 0, INT32_MAX, 0),
    IntField("n", 1, MAX_N, 1),
    IntField("priority", -PRIORITY_LIMIT, PRIORITY_LIMIT - 1, 0),
    CustomField("logit_bias", _read_logit_bias, {
        "type": "object", "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
        "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_LIMIT,
                                 "maximum": LOGIT_BIAS_LIMIT},
        "nullable": True,
    }),
    BoolField("stream"),
    CustomField("stream_options", _read_stream_options, {
        "type": "object", "nullable": True,
        "properties": {name: f.schema() for name, f in STREAM_OPTION_FIELDS.items()},
    }),
    BoolField("echo"),
    CustomField("prompt_logprobs", _read_prompt_logprobs, PROMPT_LOGPROBS_BOUND.schema()),
    BoolField("return_token_ids"),
    BoolField("skip_special_tokens", True),
    BoolField("include_stop_str_in_output"),
    BoolField("return_tokens_as_token_ids"),
    # the fast tokenizers never put a space between adjacent special tokens, which is what
    # `false` asks for; `true` (vLLM's default) decodes the same way here
    BoolField("spaces_between_special_tokens", True),
    BoolField("add_special_tokens", None),  # None: the endpoint's default (vLLM's)
    CustomField("truncate_prompt_tokens", _read_truncate_prompt_tokens, {
        "type": "integer", "minimum": -1, "maximum": INT32_MAX, "nullable": True,
    }),
    *ENGINE_FIELDS,
)  # fmt: skip
COMPLETION_FIELDS: tuple[Field, ...] = (
    CustomField("prompt", _read_prompts, {
        "oneOf": [
            {"type": "string", "minLength": 1},
            _TOKEN_IDS,
            {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_PROMPTS,
             "items": {"oneOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]}},
        ]
    }),
    IntField("logprobs", 0, MAX_LOGPROBS),
)  # fmt: skip
CHAT_FIELDS: tuple[Field, ...] = (
    CustomField("messages", read_messages, MESSAGES_SCHEMA),
    IntField("max_completion_tokens", 0, INT32_MAX),
    BoolField("logprobs"),
    IntField("top_logprobs", 0, MAX_LOGPROBS),
    BoolField("add_generation_prompt", True),
    BoolField("continue_final_message"),
    StringField("chat_template"),  # honoured only with --trust-request-chat-template
    CustomField("chat_template_kwargs", _read_chat_template_kwargs,
                {"type": "object", "nullable": True}),
)  # fmt: skip
REQUIRED = {"completion": ["prompt"], "chat": ["messages"]}

COMMON = {f.name: f for f in COMMON_FIELDS}
COMPLETION = {**COMMON, **{f.name: f for f in COMPLETION_FIELDS}}
CHAT = {**COMMON, **{f.name: f for f in CHAT_FIELDS}}
