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

from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.field_table import CHAT, COMMON

# vLLM parameters this server cannot honour: refused (400 naming them) unless sent with the
# value that means "off", so that nobody believes they took effect.
REFUSED_UNLESS_OFF: dict[str, tuple[Any, str]] = {
    "prompt_embeds": (None, "prompts are token ids or text only"),
    "lora_request": (None, "LoRA adapters are not supported"),
    "logits_processors": (None, "custom logits processors are not supported"),
}


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
    # echo with max_tokens 0 (lm-eval's loglikelihood): one token is generated, as vLLM does,
    # and counted in usage, but only the prompt is shown
    prompt_only: bool = False
    return_tokens_as_token_ids: bool = False  # logprob tokens as "token_id:<id>" (vLLM)


def refuse_unsupported_vllm_options(body: dict[str, Any]) -> None:
    for name, (off, reason) in REFUSED_UNLESS_OFF.items():
        value = body.get(name)
        if value is not None and value != off and value != []:
            raise bad_request(f"`{name}` is not supported by this server: {reason}", name)


_OUTPUT_FIELDS = (
    "echo", "prompt_logprobs", "return_token_ids", "skip_special_tokens",
    "include_stop_str_in_output", "add_special_tokens", "truncate_prompt_tokens",
    "return_tokens_as_token_ids",
)  # fmt: skip


def read_output_options(body: dict[str, Any]) -> OutputOptions:
    refuse_unsupported_vllm_options(body)
    COMMON["spaces_between_special_tokens"].read(body)  # its type; both values decode alike
    stream_options = COMMON["stream_options"].read(body)
    return OutputOptions(
        continuous_usage_stats=stream_options["continuous_usage_stats"],
        **{name: COMMON[name].read(body) for name in _OUTPUT_FIELDS},
    )


def read_continue_final_message(body: dict[str, Any], add_generation_prompt: bool) -> bool:
    value = CHAT["continue_final_message"].read(body)
    if value and add_generation_prompt:
        raise bad_request(
            "`continue_final_message` and `add_generation_prompt` cannot both be true "
            "(set `add_generation_prompt` to false to continue the last message)",
            "continue_final_message",
        )
    return value
