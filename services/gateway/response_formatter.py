"""OpenAI response bodies and stream chunks, for `/v1/completions` ("completion") and
`/v1/chat/completions` ("chat")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.gateway.logprob_formatter import chat_logprobs, completion_logprobs
from services.gateway.output_processor import ChoiceProcessor, ChoiceUpdate
from services.gateway.tool_calls import ToolCallMode, as_tool_call_message


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
class ResponseFormatter:
    kind: str  # "completion" | "chat"
    response_id: str
    model: str
    created: int
    want_logprobs: bool
    tool_call: ToolCallMode | None = None  # chat outputs to return as tool_calls

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, update_logprobs: list) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        if self.kind == "chat":
            return chat_logprobs(update_logprobs)
        return completion_logprobs(update_logprobs)

    def role_chunk(self, index: int) -> dict[str, Any]:
        """Chat streams open each choice with the assistant role."""
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._envelope("chat.completion.chunk", [choice])

    def chunk(self, index: int, update: ChoiceUpdate) -> dict[str, Any]:
        logprobs = self._logprobs(update.logprobs)
        if self.kind == "chat":
            delta = {"content": update.text} if update.text else {}
            choice = {"index": index, "delta": delta}
            choice.update(logprobs=logprobs, finish_reason=update.finish_reason)
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": update.text, "logprobs": logprobs}
        choice["finish_reason"] = update.finish_reason
        return self._envelope("text_completion", [choice])

    def tool_call_chunk(self, index: int, update: ChoiceUpdate, text: str) -> dict[str, Any]:
        """A streamed tool call comes whole, in the chunk that finishes its choice (`text`:
        the choice's whole output)."""
        assert self.tool_call is not None
        message = {"role": "assistant", "content": text}
        message, reason = as_tool_call_message(message, update.finish_reason, self.tool_call)
        delta: dict[str, Any] = {"content": text} if message.get("content") else {}
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        choice = {"index": index, "delta": delta, "logprobs": self._logprobs(update.logprobs)}
        choice["finish_reason"] = reason
        return self._envelope("chat.completion.chunk", [choice])

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        name = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._envelope(name, [])
        body["usage"] = usage.body()
        return body

    def full(
        self, processors: list[ChoiceProcessor], logprobs: list[list], usage: Usage
    ) -> dict[str, Any]:
        choices = []
        for index, processor in enumerate(processors):
            if self.kind == "chat":
                choice: dict[str, Any] = {
                    "index": index,
                    "message": {"role": "assistant", "content": processor.text},
                }
            else:
                choice = {"index": index, "text": processor.text}
            choice["logprobs"] = self._logprobs(logprobs[index])
            choice["finish_reason"] = processor.finish_reason
            if self.kind == "chat" and self.tool_call is not None:
                choice["message"], choice["finish_reason"] = as_tool_call_message(
                    choice["message"], processor.finish_reason, self.tool_call
                )
            choices.append(choice)
        body = self._envelope(
            "chat.completion" if self.kind == "chat" else "text_completion", choices
        )
        body["usage"] = usage.body()
        return body
