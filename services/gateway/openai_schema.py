"""OpenAI request bodies -> typed, validated requests, with errors that name the parameter and
the bound it broke (like TGI's "`top_p` must be > 0.0 and <= 1.0").

Only shape and range are checked here; what needs the tokenizer (prompt length against
max_model_len, token ids against the vocabulary) is checked in `request_builder`.
Unknown fields are ignored, as OpenAI's SDKs send extras; fields we cannot honour
(`suffix`, `tools`, ...) are refused rather than silently dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.structured_outputs import StructuredRequest, read_structured
from pagedserve.services.gateway.tool_calls import (
    open_call_prefix,
    read_message_tool_fields,
    rendered_tools,
    wants_auto,
)
from pagedserve.services.gateway.vllm_options import (
    OutputOptions,
    read_chat_template_kwargs,
    read_continue_final_message,
    read_logit_bias,
    read_output_options,
)
from pagedserve.shared.request_bounds import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_LOGPROBS,
)
from pagedserve.shared.value_checks import is_finite_number, is_int

MAX_N = 16  # choices per request
MAX_BATCH_PROMPTS = 64  # prompts in one /v1/completions call
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_MESSAGES = 1024
SEED_MIN, SEED_MAX = INT64_MIN, INT64_MAX
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions and vLLM
PRIORITY_LIMIT = -INT32_MIN
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
UNSUPPORTED = ("suffix", "functions")


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling fields shared by completions and chat, validated."""

    max_tokens: int | None  # None: up to the model length; 0: prompt only (after the prefill)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: none; k: the sampled token's plus top k
    n: int = 1
    priority: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    prompt_logprobs: int | None = None  # what the engine computes (echo + logprobs asks too)
    structured: StructuredRequest | None = None  # response_format, guided_*, tools, ...


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]  # one choice set per prompt
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    output: OutputOptions = field(default_factory=OutputOptions)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_fields: dict[str, Any] = field(default_factory=dict)  # tool_calls, tool_call_id, name


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[ChatMessage]
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    add_generation_prompt: bool = True
    max_tokens_param: str = "max_tokens"  # which name the client used, for error messages
    output: OutputOptions = field(default_factory=OutputOptions)
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # rendered by the chat template
    auto_tools: bool = False  # tool_choice "auto": calls are read from the text
    tool_text_prefix: str = ""  # an open <tool_call> the output continues (see tool_calls)


# ---------------------------------------------------------------------------------------------
# Field readers: each takes the body, the field name and the bound, and raises a 400 naming it.


def read_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"`{name}` must be a boolean, got {_kind(value)}", name)
    return value


def read_int(
    body: dict[str, Any], name: str, default: int | None, low: int, high: int
) -> int | None:
    """An integer in [low, high], or `default` when absent/null."""
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value):
        raise bad_request(f"`{name}` must be an integer, got {_kind(value)}", name)
    if not low <= value <= high:
        raise bad_request(f"`{name}` must be >= {low} and <= {high}, got {value}", name)
    return value


def read_float(
    body: dict[str, Any],
    name: str,
    default: float,
    low: float,
    high: float,
    *,
    low_open: bool = False,
) -> float:
    """A number in [low, high] (or (low, high] with `low_open`), or `default` when absent."""
    value = body.get(name)
    if value is None:
        return default
    if not is_finite_number(value):
        raise bad_request(f"`{name}` must be a finite number, got {_kind(value)}", name)
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        low_sign = ">" if low_open else ">="
        raise bad_request(f"`{name}` must be {low_sign} {low} and <= {high}, got {value}", name)
    return float(value)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    kinds = {str: "string", int: "integer", float: "number", list: "array", dict: "object"}
    return kinds.get(type(value), type(value).__name__)


def read_stop(body: dict[str, Any]) -> tuple[str, ...]:
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


def read_stop_token_ids(body: dict[str, Any]) -> tuple[int, ...]:
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


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in UNSUPPORTED:
        value = body.get(name)
        if value not in (None, False, {}, [], ""):
            raise bad_request(f"`{name}` is not supported by this server", name)
    best_of = body.get("best_of")
    if best_of not in (None, 1) and best_of != body.get("n", 1):
        raise bad_request("`best_of` is not supported (only best_of == n)", "best_of")


def read_sampling(
    body: dict[str, Any],
    max_tokens_name: str,
    logprobs: int | None,
    default_max_tokens: int | None = None,
) -> SamplingOptions:
    """The sampling fields common to both endpoints."""
    _refuse_unsupported(body)
    max_tokens = read_int(body, max_tokens_name, default_max_tokens, 0, INT32_MAX)
    temperature = read_float(body, "temperature", 1.0, 0.0, 2.0)
    top_k = read_int(body, "top_k", -1, -1, INT32_MAX)
    min_tokens = read_int(body, "min_tokens", 0, 0, INT32_MAX)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(
            f"`min_tokens` must be <= `{max_tokens_name}` ({max_tokens}), got {min_tokens}",
            "min_tokens",
        )
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=read_float(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=-1 if top_k == 0 else top_k,  # 0 and -1 both mean "all tokens", as in vLLM
        min_p=read_float(body, "min_p", 0.0, 0.0, 1.0),
        presence_penalty=read_float(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=read_float(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=read_float(body, "repetition_penalty", 1.0, 0.0, 2.0, low_open=True),
        seed=read_int(body, "seed", None, SEED_MIN, SEED_MAX),
        stop=read_stop(body),
        stop_token_ids=read_stop_token_ids(body),
        ignore_eos=read_bool(body, "ignore_eos", False),
        min_tokens=min_tokens,
        logprobs=logprobs,
        n=read_int(body, "n", 1, 1, MAX_N),
        priority=read_int(body, "priority", 0, -PRIORITY_LIMIT, PRIORITY_LIMIT - 1),
        logit_bias=read_logit_bias(body),
    )


def with_prompt_logprobs(sampling: SamplingOptions, output: OutputOptions) -> SamplingOptions:
    """The engine computes prompt logprobs for `prompt_logprobs`, and for `echo` with
    `logprobs` (the echoed prompt tokens carry theirs, as in vLLM)."""
    wanted = [k for k in (output.prompt_logprobs,) if k is not None]
    if output.echo and sampling.logprobs is not None:
        wanted.append(sampling.logprobs)
    if not wanted:
        return sampling
    return dataclasses.replace(sampling, prompt_logprobs=max(wanted))


def _read_model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"`model` must be a string, got {_kind(model)}", "model")
    return model


def _read_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = read_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object", "stream_options")
    if not stream:
        raise bad_request(
            "`stream_options` is only allowed when `stream` is true", "stream_options"
        )
    return stream, read_bool(options, "include_usage", False)


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


def parse_completion_request(body: Any) -> CompletionRequest:
    """A /v1/completions body -> CompletionRequest, or a 400 `APIError`."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    logprobs = read_int(body, "logprobs", None, 0, MAX_LOGPROBS)
    stream, include_usage = _read_stream(body)
    output = read_output_options(body, stream)
    sampling = read_sampling(body, "max_tokens", logprobs, COMPLETION_DEFAULT_MAX_TOKENS)
    return CompletionRequest(
        model=_read_model(body),
        prompts=_read_prompts(body),
        sampling=dataclasses.replace(
            with_prompt_logprobs(sampling, output), structured=read_structured(body, False)
        ),
        stream=stream,
        include_usage=include_usage,
        output=output,
    )


def _read_content(content: Any, index: int) -> str:
    param = f"messages[{index}].content"
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise bad_request(f"`{param}` parts must be of type 'text'", param)
            if not isinstance(part.get("text"), str):
                raise bad_request(f"`{param}` text parts need a string `text`", param)
            parts.append(part["text"])
        return "\n".join(parts)
    raise bad_request(f"`{param}` must be a string or an array of text parts", param)


def _read_messages(body: dict[str, Any]) -> list[ChatMessage]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(
            f"`messages` may hold at most {MAX_MESSAGES} messages, got {len(messages)}",
            "messages",
        )
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"`messages[{index}]` must be an object", f"messages[{index}]")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(
                f"`messages[{index}].role` must be one of {sorted(CHAT_ROLES)}, got {role!r}",
                f"messages[{index}].role",
            )
        content = _read_content(message.get("content"), index)
        parsed.append(ChatMessage(role, content, read_message_tool_fields(message, index)))
    return parsed


def parse_chat_request(body: Any) -> ChatRequest:
    """A /v1/chat/completions body -> ChatRequest, or a 400 `APIError`."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    want_logprobs = read_bool(body, "logprobs", False)
    top_logprobs = read_int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top_logprobs is not None and not want_logprobs:
        raise bad_request("`top_logprobs` needs `logprobs` set to true", "top_logprobs")
    logprobs = (top_logprobs or 0) if want_logprobs else None
    # max_completion_tokens replaces the deprecated max_tokens; take it when both are sent.
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    stream, include_usage = _read_stream(body)
    output = read_output_options(body, stream)
    add_generation_prompt = read_bool(body, "add_generation_prompt", True)
    return ChatRequest(
        model=_read_model(body),
        messages=_read_messages(body),
        # chat's echo repeats a message's text, never prompt tokens' logprobs
        sampling=dataclasses.replace(
            with_prompt_logprobs(
                read_sampling(body, name, logprobs), dataclasses.replace(output, echo=False)
            ),
            structured=read_structured(body, True),
        ),
        stream=stream,
        include_usage=include_usage,
        add_generation_prompt=add_generation_prompt,
        max_tokens_param=name,
        output=output,
        continue_final_message=read_continue_final_message(body, add_generation_prompt),
        chat_template_kwargs=read_chat_template_kwargs(body),
        tools=rendered_tools(body),
        auto_tools=wants_auto(body),
        tool_text_prefix=open_call_prefix(body) if wants_auto(body) else "",
    )
