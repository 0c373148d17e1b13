"""OpenAI response bodies and stream chunks, for `/v1/completions` ("completion") and
`/v1/chat/completions` ("chat"), with vLLM's extras when asked for: echo, prompt logprobs,
token ids, usage in every chunk."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.logprob_formatter import chat_logprobs, completion_logprobs
from pagedserve.services.gateway.output_modes import (
    PLAIN_TEXT,
    ChoiceStream,
    HermesToolCalls,
    OutputMode,
)
from pagedserve.services.gateway.output_processor import ChoiceProcessor, ChoiceUpdate
from pagedserve.services.gateway.prompt_logprobs import (
    echo_completion_logprobs,
    prepend_echo,
    vllm_prompt_logprobs,
)
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from pagedserve.services.gateway.vllm_options import OutputOptions


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True)
class PromptView:
    """What the formatter shows of one prompt: its token ids and, for echo, its text."""

    token_ids: list[int]
    echo_text: str = ""


@dataclass(frozen=True)
class ResponseFormatter:
    kind: str  # "completion" | "chat"
    response_id: str
    model: str
    created: int
    want_logprobs: bool
    info: TokenizerInfo | None = None  # needed for echo and prompt logprobs
    output: OutputOptions = field(default_factory=OutputOptions)
    prompts: list[PromptView] = field(default_factory=list)
    n: int = 1  # choices per prompt
    logprobs_k: int = 0
    mode: OutputMode = PLAIN_TEXT  # how a chat output becomes a message (text, tool calls)
    # told (streaming, a call found) each time the Hermes parser reads an output or a delta
    on_tool_parse: Callable[[bool, bool], None] | None = None
    _started: set[int] = field(default_factory=set)  # choices whose first chunk went out
    _streams: dict[int, ChoiceStream] = field(default_factory=dict)  # per streamed chat choice

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "system_fingerprint": None,  # as vLLM: the key is there, no fingerprint
        }

    def _tool_parsed(self, streaming: bool, called: bool) -> None:
        if self.on_tool_parse is not None and isinstance(self.mode, HermesToolCalls):
            self.on_tool_parse(streaming, called)

    def _prompt(self, index: int) -> PromptView:
        return self.prompts[index // self.n] if self.prompts else PromptView([])

    def _logprobs(
        self, entries: list, index: int, processor: ChoiceProcessor | None, with_echo: bool
    ) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        if self.kind == "chat":
            return chat_logprobs(entries)
        generated = completion_logprobs(entries)
        if not (with_echo and self.output.echo and self.info is not None):
            return generated
        prompt = self._prompt(index)
        prompt_logprobs = processor.prompt_logprobs if processor else None
        echo = echo_completion_logprobs(self.info, prompt.token_ids, prompt_logprobs,
                                        self.logprobs_k)  # fmt: skip
        return prepend_echo(echo, generated)

    def _echo_text(self, index: int) -> str:
        return self._prompt(index).echo_text if self.output.echo else ""

    def role_chunk(self, index: int) -> dict[str, Any]:
        """Chat streams open each choice with the assistant role (and echo, if asked)."""
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": self._echo_text(index)},
            "logprobs": None,
            "finish_reason": None,
        }
        body = self._envelope("chat.completion.chunk", [choice])
        if self.output.continuous_usage_stats:  # vLLM: usage in every chunk, this one too
            body["usage"] = Usage(len(self._prompt(index).token_ids), 0, 0).body()
        return body

    def chunk(
        self, index: int, update: ChoiceUpdate, processor: ChoiceProcessor | None = None
    ) -> dict[str, Any] | None:
        """The chunk for one update of a streamed choice; None when there is nothing to send
        yet (the output mode holds text back, or the update brought nothing)."""
        if self.output.prompt_only:  # the generated token is counted, never shown
            update = dataclasses.replace(update, text="", logprobs=[], token_ids=[])
        if self.kind == "chat":
            stream = self._streams.get(index) or self._streams.setdefault(index, self.mode.stream())
            piece = stream.feed(update.text, update.finish_reason)
            self._tool_parsed(True, piece is not None and "tool_calls" in piece.delta)
            if piece is None:
                return None
            delta, reason = piece.delta, piece.finish_reason
        else:
            delta, reason = {"text": update.text} if update.text else {}, update.finish_reason
        with_ids = bool(update.token_ids) and self.output.return_token_ids
        if not (delta or update.logprobs or reason or with_ids):
            return None
        first = index not in self._started
        self._started.add(index)
        logprobs = self._logprobs(update.logprobs, index, processor, first)
        if self.kind == "chat":
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            choice["stop_reason"] = update.stop_reason
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            text = (self._echo_text(index) if first else "") + update.text
            choice = {"index": index, "text": text, "logprobs": logprobs}
            choice["finish_reason"] = reason
            choice["stop_reason"] = update.stop_reason
            body = self._envelope("text_completion", [choice])
        self._add_stream_extras(body, choice, index, update, processor, first)
        return body

    def _add_stream_extras(
        self,
        body: dict[str, Any],
        choice: dict[str, Any],
        index: int,
        update: ChoiceUpdate,
        processor: ChoiceProcessor | None,
        first: bool,
    ) -> None:
        if self.output.return_token_ids:
            choice["token_ids"] = update.token_ids
            if first:
                holder = body if self.kind == "chat" else choice
                holder["prompt_token_ids"] = self._prompt(index).token_ids
        if self.output.continuous_usage_stats and processor is not None:
            num_prompt = len(self._prompt(index).token_ids)
            body["usage"] = Usage(num_prompt, processor.num_output_tokens, 0).body()

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        name = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._envelope(name, [])
        body["usage"] = usage.body()
        return body

    @property
    def _prompt_logprobs_k(self) -> int | None:
        """How many alternatives the prompt logprobs show: `prompt_logprobs`, or with `echo`
        and `logprobs` the echoed prompt's (vLLM fills `prompt_logprobs` then too)."""
        if self.output.prompt_logprobs is not None:
            return self.output.prompt_logprobs
        echoed = self.kind == "completion" and self.output.echo and self.want_logprobs
        return self.logprobs_k if echoed else None

    def _prompt_logprobs(self, index: int, processor: ChoiceProcessor) -> list | None:
        k = self._prompt_logprobs_k
        if k is None or self.info is None:
            return None
        prompt_ids = self._prompt(index).token_ids
        return vllm_prompt_logprobs(self.info, prompt_ids, processor.prompt_logprobs, k)

    def _full_choice(self, index: int, processor: ChoiceProcessor, entries: list) -> dict:
        prompt_only = self.output.prompt_only
        text = self._echo_text(index) + ("" if prompt_only else processor.text)
        entries = [] if prompt_only else entries
        reason = processor.finish_reason
        if self.kind == "chat":
            message, reason = self.mode.message(text, reason)
            self._tool_parsed(False, "tool_calls" in message)
            choice: dict[str, Any] = {"index": index, "message": message}
        else:
            choice = {"index": index, "text": text}
            choice["prompt_logprobs"] = self._prompt_logprobs(index, processor)
            if self.output.return_token_ids:
                choice["prompt_token_ids"] = self._prompt(index).token_ids
        choice["logprobs"] = self._logprobs(entries, index, processor, True)
        choice["finish_reason"] = reason
        choice["stop_reason"] = processor.stop_reason
        if self.output.return_token_ids:
            choice["token_ids"] = processor.token_ids
        return choice

    def full(
        self, processors: list[ChoiceProcessor], logprobs: list[list], usage: Usage
    ) -> dict[str, Any]:
        choices = [
            self._full_choice(index, processor, logprobs[index])
            for index, processor in enumerate(processors)
        ]
        body = self._envelope(
            "chat.completion" if self.kind == "chat" else "text_completion", choices
        )
        if self.kind == "chat" and self.output.prompt_logprobs is not None:
            body["prompt_logprobs"] = self._prompt_logprobs(0, processors[0])
        if self.kind == "chat" and self.output.return_token_ids:
            body["prompt_token_ids"] = self._prompt(0).token_ids
        body["usage"] = usage.body()
        return body
