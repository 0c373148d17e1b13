"""OpenAI response bodies and stream chunks, for `/v1/completions` ("completion") and
`/v1/chat/completions` ("chat"), with vLLM's extras when asked for: echo, prompt logprobs,
token ids, usage in every chunk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.hermes_tool_parser import (
    HermesStreamParser,
    StreamEvent,
    merged_call_deltas,
)
from pagedserve.services.gateway.logprob_formatter import chat_logprobs, completion_logprobs
from pagedserve.services.gateway.output_processor import ChoiceProcessor, ChoiceUpdate
from pagedserve.services.gateway.prompt_logprobs import (
    echo_completion_logprobs,
    prepend_echo,
    vllm_prompt_logprobs,
)
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from pagedserve.services.gateway.tool_calls import (
    ToolCallMode,
    as_auto_tool_message,
    as_tool_call_message,
)
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
    tool_call: ToolCallMode | None = None  # chat outputs to return as tool_calls
    auto_tools: bool = False  # chat outputs hold Hermes calls to read (tool_choice "auto")
    tool_text_prefix: str = ""  # the open call a continued message's output completes
    _started: set[int] = field(default_factory=set)  # choices whose first chunk went out
    _tool_parsers: dict[int, HermesStreamParser] = field(default_factory=dict)

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

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
        return self._envelope("chat.completion.chunk", [choice])

    def chunk(
        self, index: int, update: ChoiceUpdate, processor: ChoiceProcessor | None = None
    ) -> dict[str, Any]:
        first = index not in self._started
        self._started.add(index)
        logprobs = self._logprobs(update.logprobs, index, processor, first)
        if self.kind == "chat":
            delta = {"content": update.text} if update.text else {}
            choice = {"index": index, "delta": delta}
            choice.update(logprobs=logprobs, finish_reason=update.finish_reason)
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            text = (self._echo_text(index) if first else "") + update.text
            choice = {"index": index, "text": text, "logprobs": logprobs}
            choice["finish_reason"] = update.finish_reason
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

    def tool_call_chunk(
        self, index: int, update: ChoiceUpdate, processor: ChoiceProcessor
    ) -> dict[str, Any]:
        """A streamed tool call comes whole, in the chunk that finishes its choice."""
        assert self.tool_call is not None
        message = {"role": "assistant", "content": processor.text}
        message, reason = as_tool_call_message(message, update.finish_reason, self.tool_call)
        delta: dict[str, Any] = {"content": processor.text} if message.get("content") else {}
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        logprobs = self._logprobs(update.logprobs, index, processor, False)
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return self._envelope("chat.completion.chunk", [choice])

    def auto_tool_chunk(
        self, index: int, update: ChoiceUpdate, processor: ChoiceProcessor | None
    ) -> dict[str, Any] | None:
        """A chat chunk of a streamed output read for Hermes calls: its content and call
        deltas (vLLM's shape); None when the update adds nothing to send yet."""
        parser = self._tool_parsers.get(index)
        events: list[StreamEvent] = []
        if parser is None:
            parser = self._tool_parsers[index] = HermesStreamParser()
            events += parser.feed(self.tool_text_prefix)
        events += parser.feed(update.text)
        if update.finish_reason is not None:
            events += parser.finish()
        if not (events or update.finish_reason or update.logprobs):
            return None
        first = index not in self._started
        self._started.add(index)
        delta: dict[str, Any] = {}
        content = "".join(e.content for e in events)
        if content:
            delta["content"] = content
        calls = merged_call_deltas(events)
        if calls:
            delta["tool_calls"] = calls
        reason = update.finish_reason
        if reason == "stop" and parser.called:
            reason = "tool_calls"
        logprobs = self._logprobs(update.logprobs, index, processor, False)
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        body = self._envelope("chat.completion.chunk", [choice])
        self._add_stream_extras(body, choice, index, update, processor, first)
        return body

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        name = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._envelope(name, [])
        body["usage"] = usage.body()
        return body

    def _prompt_logprobs(self, index: int, processor: ChoiceProcessor) -> list | None:
        assert self.info is not None and self.output.prompt_logprobs is not None
        prompt_ids = self._prompt(index).token_ids
        k = self.output.prompt_logprobs
        return vllm_prompt_logprobs(self.info, prompt_ids, processor.prompt_logprobs, k)

    def _full_choice(self, index: int, processor: ChoiceProcessor, entries: list) -> dict:
        text = self._echo_text(index) + processor.text
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": text},
            }
        else:
            choice = {"index": index, "text": text}
            if self.output.prompt_logprobs is not None:
                choice["prompt_logprobs"] = self._prompt_logprobs(index, processor)
            if self.output.return_token_ids:
                choice["prompt_token_ids"] = self._prompt(index).token_ids
        choice["logprobs"] = self._logprobs(entries, index, processor, True)
        choice["finish_reason"] = processor.finish_reason
        if self.output.return_token_ids:
            choice["token_ids"] = processor.token_ids
        if self.kind == "chat" and self.tool_call is not None:
            choice["message"], choice["finish_reason"] = as_tool_call_message(
                choice["message"], processor.finish_reason, self.tool_call
            )
        elif self.kind == "chat" and self.auto_tools:
            choice["message"], choice["finish_reason"] = as_auto_tool_message(
                choice["message"], processor.finish_reason, self.tool_text_prefix
            )
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
