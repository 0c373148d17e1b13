"""OpenAI request bodies -> typed, validated requests, with errors that name the parameter and
the bound it broke (like TGI's "`top_p` must be > 0.0 and <= 1.0").

Each field is read through the field table (`field_table`), which also writes the OpenAPI
document. Only shape and range are checked here; what needs the tokenizer (prompt length against
max_model_len, token ids against the vocabulary) is checked in `request_builder`.
Unknown fields are ignored, as OpenAI's SDKs send extras; fields we cannot honour
(`suffix`, `tools`, ...) are refused rather than silently dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.chat_messages import ChatMessage
from pagedserve.services.gateway.engine_fields import read_beam_width
from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.field_table import CHAT, COMMON, COMPLETION
from pagedserve.services.gateway.output_modes import PLAIN_TEXT, HermesToolCalls, OutputMode
from pagedserve.services.gateway.structured_outputs import StructuredRequest, read_structured
from pagedserve.services.gateway.tool_calls import read_tools
from pagedserve.services.gateway.vllm_options import (
    OutputOptions,
    read_continue_final_message,
    read_output_options,
)
from pagedserve.shared.protocol import GREEDY_TEMPERATURE

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions and vLLM
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
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()  # tokenized in request_builder, as vLLM does
    cache_salt: str | None = None
    beam_width: int = 0  # beam search with this many beams (best_of or n); 0: none
    length_penalty: float = 1.0


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]  # one choice set per prompt
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    output: OutputOptions = field(default_factory=OutputOptions)


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
    mode: OutputMode = PLAIN_TEXT  # how the output is returned (text, tool calls)
    chat_template: str | None = None  # the request's own template (a trusting server only)

    @property
    def auto_tools(self) -> bool:
        """tool_choice "auto": calls are read from the text (`AutoTools` checks the setup)."""
        return isinstance(self.mode, HermesToolCalls)


# ---------------------------------------------------------------------------------------------
# Readers over the field table: each field raises a 400 naming itself and the bound it broke.


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in UNSUPPORTED:
        value = body.get(name)
        if value not in (None, False, {}, [], ""):
            raise bad_request(f"`{name}` is not supported by this server", name)


def read_sampling(
    body: dict[str, Any],
    max_tokens_name: str,
    logprobs: int | None,
    default_max_tokens: int | None = None,
) -> SamplingOptions:
    """The sampling fields common to both endpoints."""
    _refuse_unsupported(body)
    fields = CHAT if max_tokens_name == "max_completion_tokens" else COMMON
    max_tokens = fields[max_tokens_name].read(body, default_max_tokens)
    min_tokens = COMMON["min_tokens"].read(body)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(
            f"`min_tokens` must be <= `{max_tokens_name}` ({max_tokens}), got {min_tokens}",
            "min_tokens",
        )
    top_k = COMMON["top_k"].read(body)
    read = {name: COMMON[name].read(body) for name in _PLAIN_SAMPLING_FIELDS}
    beam_width = read_beam_width(body, read["n"], logprobs)
    # beam search's n results are its n best beams, which differ whatever the temperature
    if read["n"] > 1 and read["temperature"] < GREEDY_TEMPERATURE and not beam_width:
        raise bad_request(
            f"`n` must be 1 when using greedy sampling (temperature 0), got {read['n']}", "n"
        )
    return SamplingOptions(
        max_tokens=max_tokens,
        top_k=-1 if top_k == 0 else top_k,  # 0 and -1 both mean "all tokens", as in vLLM
        min_tokens=min_tokens,
        logprobs=logprobs,
        beam_width=beam_width,
        **read,
    )


_PLAIN_SAMPLING_FIELDS = (
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "n", "priority",
    "logit_bias", "allowed_token_ids", "bad_words", "cache_salt", "length_penalty",
)  # fmt: skip


def with_prompt_logprobs(sampling: SamplingOptions, output: OutputOptions) -> SamplingOptions:
    """The engine computes prompt logprobs for `prompt_logprobs`, and for `echo` with
    `logprobs` (the echoed prompt tokens carry theirs, as in vLLM)."""
    wanted = [k for k in (output.prompt_logprobs,) if k is not None]
    if output.echo and sampling.logprobs is not None:
        wanted.append(sampling.logprobs)
    if not wanted:
        return sampling
    return dataclasses.replace(sampling, prompt_logprobs=max(wanted))


def _read_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = COMMON["stream"].read(body)
    return stream, COMMON["stream_options"].read(body)["include_usage"]


def _at_least_one_token(
    sampling: SamplingOptions, output: OutputOptions, name: str
) -> tuple[SamplingOptions, OutputOptions]:
    """vLLM's rule: `max_tokens` 0 is a 400, except with completions' `echo`, where one token
    is generated and only the prompt is shown."""
    if sampling.max_tokens != 0:
        return sampling, output
    if not output.echo or name != "max_tokens":
        raise bad_request(f"`{name}` must be at least 1, got 0", name)
    return (
        dataclasses.replace(sampling, max_tokens=1),
        dataclasses.replace(output, prompt_only=True),
    )


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def parse_completion_request(body: Any) -> CompletionRequest:
    """A /v1/completions body -> CompletionRequest, or a 400 `APIError`."""
    body = _require_object(body)
    logprobs = COMPLETION["logprobs"].read(body)
    stream, include_usage = _read_stream(body)
    output = read_output_options(body)
    sampling = read_sampling(body, "max_tokens", logprobs, COMPLETION_DEFAULT_MAX_TOKENS)
    sampling, output = _at_least_one_token(sampling, output, "max_tokens")
    if body.get("tools"):
        raise bad_request("`tools` is only supported by /v1/chat/completions", "tools")
    return CompletionRequest(
        model=COMMON["model"].read(body),
        prompts=COMPLETION["prompt"].read(body),
        sampling=dataclasses.replace(
            with_prompt_logprobs(sampling, output), structured=read_structured(body)
        ),
        stream=stream,
        include_usage=include_usage,
        output=output,
    )


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    want_logprobs = CHAT["logprobs"].read(body)
    top_logprobs = CHAT["top_logprobs"].read(body)
    if top_logprobs is not None and not want_logprobs:
        raise bad_request("`top_logprobs` needs `logprobs` set to true", "top_logprobs")
    return (top_logprobs or 0) if want_logprobs else None


def parse_chat_request(body: Any) -> ChatRequest:
    """A /v1/chat/completions body -> ChatRequest, or a 400 `APIError`."""
    body = _require_object(body)
    logprobs = _chat_logprobs(body)
    # max_completion_tokens replaces the deprecated max_tokens; take it when both are sent.
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    stream, include_usage = _read_stream(body)
    output = read_output_options(body)
    add_generation_prompt = CHAT["add_generation_prompt"].read(body)
    tools = read_tools(body)
    # chat's echo repeats a message's text, never prompt tokens' logprobs
    sampling, _ = _at_least_one_token(
        read_sampling(body, name, logprobs), dataclasses.replace(output, echo=False), name
    )
    sampling = with_prompt_logprobs(sampling, dataclasses.replace(output, echo=False))
    return ChatRequest(
        model=COMMON["model"].read(body),
        messages=CHAT["messages"].read(body),
        sampling=dataclasses.replace(sampling, structured=read_structured(body, tools)),
        stream=stream,
        include_usage=include_usage,
        add_generation_prompt=add_generation_prompt,
        max_tokens_param=name,
        output=output,
        continue_final_message=read_continue_final_message(body, add_generation_prompt),
        chat_template_kwargs=CHAT["chat_template_kwargs"].read(body),
        chat_template=CHAT["chat_template"].read(body),
        tools=tools.rendered if tools else None,
        mode=tools.mode if tools else PLAIN_TEXT,
    )
