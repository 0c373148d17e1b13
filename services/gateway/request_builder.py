"""Validated OpenAI requests -> engine requests: tokenize, check lengths against the model,
and fan `n` choices out into engine requests with their own ids (and seeds)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from pagedserve.services.gateway.admission import check_text_fits
from pagedserve.services.gateway.engine_fields import bad_words_token_ids
from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.field_table import SEED_MAX, SEED_MIN
from pagedserve.services.gateway.openai_schema import (
    ChatRequest,
    CompletionRequest,
    SamplingOptions,
)
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from pagedserve.shared.protocol import GenerateRequest, SamplingParams


@dataclass(frozen=True)
class PromptInput:
    """One prompt, tokenized."""

    token_ids: list[int]


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: keep the last `keep` tokens (-1: the model's limit)."""
    if keep is None:
        return token_ids
    keep = max_model_len if keep == -1 else keep
    return token_ids[-keep:]


def tokenize_completion(request: CompletionRequest, info: TokenizerInfo) -> list[PromptInput]:
    prompts = []
    for index, prompt in enumerate(request.prompts):
        if isinstance(prompt, str):
            add_special = request.output.add_special_tokens
            token_ids = info.tokenizer.encode(prompt, add_special_tokens=add_special is not False)
        else:
            bad = next((t for t in prompt if not 0 <= t < info.vocab_size), None)
            if bad is not None:
                raise bad_request(
                    f"prompt {index} holds token id {bad}, outside [0, {info.vocab_size})",
                    "prompt",
                )
            token_ids = list(prompt)
        if not token_ids:
            raise bad_request(f"prompt {index} tokenizes to no tokens", "prompt")
        keep = request.output.truncate_prompt_tokens
        prompts.append(PromptInput(token_ids=truncate_prompt(token_ids, keep, info.max_model_len)))
    return prompts


def tokenize_chat(
    request: ChatRequest, info: TokenizerInfo, trust_request_template: bool = False
) -> list[PromptInput]:
    """The conversation rendered by the chat template and tokenized. A request's own
    `chat_template` is rendered only where the server trusts request templates
    (`--trust-request-chat-template`), checked here, where it would be rendered, so that no
    route that renders a conversation (/v1/chat/completions, /tokenize) can skip it."""
    if request.chat_template is not None and not trust_request_template:
        raise bad_request(
            "`chat_template` was sent with the request, but this server does not trust "
            "request templates (start it with --trust-request-chat-template)",
            "chat_template",
        )
    if not getattr(info.tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template: use /v1/completions", "messages")
    messages = [{"role": m.role, "content": m.content, **m.tool_fields} for m in request.messages]
    try:
        template_kwargs = {
            "add_generation_prompt": request.add_generation_prompt,
            "continue_final_message": request.continue_final_message,
            **request.chat_template_kwargs,  # the client's win, as in vLLM
        }
        if request.tools is not None:
            template_kwargs["tools"] = request.tools
        if request.chat_template is not None:  # trusted: checked above
            template_kwargs["chat_template"] = request.chat_template
        text = info.tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)
    except Exception as exc:  # the template itself rejects some conversations (jinja raise)
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from exc
    max_tokens, param = request.sampling.max_tokens, request.max_tokens_param
    check_text_fits(
        text,
        info.max_bytes_per_token,
        info.max_model_len,
        max_tokens,
        "messages",
        param,
        info.vanishing_chars,
    )  # before tokenizing: a huge conversation is refused for the cost of its length
    # The template writes the special tokens itself; adding them again would double the BOS.
    # (unless the client asks, as vLLM's `add_special_tokens` lets it)
    token_ids = info.tokenizer.encode(
        text, add_special_tokens=bool(request.output.add_special_tokens)
    )
    keep = request.output.truncate_prompt_tokens
    return [PromptInput(token_ids=truncate_prompt(token_ids, keep, info.max_model_len))]


def check_lengths(
    prompts: list[PromptInput],
    options: SamplingOptions,
    max_model_len: int,
    param: str,
    prompt_param: str = "prompt",
) -> None:
    """A 400 in vLLM's words (clients parse "maximum context length is (\\d+) tokens") when a
    prompt leaves no room, or `max_tokens` alone exceeds the model length. A prompt that fits
    but leaves fewer than `max_tokens` has its output capped at the model length (vLLM)."""
    for prompt in prompts:
        num_prompt = len(prompt.token_ids)
        if num_prompt >= max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {num_prompt} tokens in the messages (the prompt), which leaves no "
                "room for the completion. Please reduce the length of the messages.",
                prompt_param,
            )
        if options.max_tokens is not None and options.max_tokens > max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {num_prompt + options.max_tokens} tokens ({num_prompt} in the "
                f"messages, {options.max_tokens} in the completion). Please reduce the length "
                f"of the messages or completion (`{param}`).",
                param,
            )


def choice_seed(options: SamplingOptions, choice: int) -> int | None:
    """Choice i of a seeded request samples with seed + i, so that the choices differ. A sampled
    request without a seed gets a random one here: an engine that crashes runs a request again
    from its prompt, and only a seeded one regenerates the tokens its client was already shown
    (the gateway's ReplayGuard then drops them and the stream goes on seamlessly)."""
    if options.seed is not None:
        # wraps within int64, so every client seed stays its own engine seed
        return (options.seed + choice - SEED_MIN) % 2**64 + SEED_MIN
    if options.temperature > 0:
        return secrets.randbelow(SEED_MAX + 1)
    return None


def sampling_params(
    options: SamplingOptions, info: TokenizerInfo, num_prompt_tokens: int, choice: int
) -> SamplingParams:
    for token_id in options.stop_token_ids:
        if token_id >= info.vocab_size:
            raise bad_request(
                f"`stop_token_ids` holds {token_id}, outside [0, {info.vocab_size})",
                "stop_token_ids",
            )
    for token_id, _ in options.logit_bias:
        if token_id >= info.vocab_size:
            raise bad_request(
                f"`logit_bias` names token {token_id}, outside [0, {info.vocab_size})",
                "logit_bias",
            )
    room = info.max_model_len - num_prompt_tokens
    max_tokens = room if options.max_tokens is None else min(options.max_tokens, room)
    seed = choice_seed(options, choice) if not options.beam_width else None
    return SamplingParams(
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        min_p=options.min_p,
        seed=seed,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        repetition_penalty=options.repetition_penalty,
        max_tokens=max_tokens,
        min_tokens=min(options.min_tokens, max_tokens),
        stop_token_ids=options.stop_token_ids,
        eos_token_ids=info.eos_token_ids,
        ignore_eos=options.ignore_eos,
        logprobs=options.logprobs,
        prompt_logprobs=options.prompt_logprobs,
        logit_bias=options.logit_bias,
        structured_output=options.structured.output if options.structured else None,
        allowed_token_ids=_allowed_token_ids(options, info),
        bad_words_token_ids=_bad_words(options, info),
        beam_width=options.beam_width,
        length_penalty=options.length_penalty,
        n=options.n if options.beam_width else 1,
    )


def _allowed_token_ids(options: SamplingOptions, info: TokenizerInfo) -> tuple[int, ...] | None:
    outside = [t for t in options.allowed_token_ids or () if t >= info.vocab_size]
    if outside:
        raise bad_request(
            f"`allowed_token_ids` holds {outside[:5]}, outside the vocabulary "
            f"[0, {info.vocab_size})",
            "allowed_token_ids",
        )
    return options.allowed_token_ids


def _bad_words(options: SamplingOptions, info: TokenizerInfo) -> tuple[tuple[int, ...], ...]:
    token_ids = bad_words_token_ids(options.bad_words, info.tokenizer)
    outside = [t for word in token_ids for t in word if t >= info.vocab_size]
    if outside:
        raise bad_request(
            f"The model vocabulary size is {info.vocab_size}, but `bad_words` tokenize to "
            f"{outside[:5]}, outside it",
            "bad_words",
        )
    return token_ids


def engine_requests(
    request_id: str,
    prompts: list[PromptInput],
    options: SamplingOptions,
    info: TokenizerInfo,
    gateway_id: str,
) -> list[GenerateRequest]:
    """One engine request per (prompt, choice), ids `<request_id>-<choice index>`; with a
    seed, choice i of a prompt samples with seed + i so that the choices differ. With beam
    search only each prompt's first choice is sent: its n beams come back as the n choices
    (`beam_leaders`)."""
    now = time.time()
    requests = []
    for prompt_index, prompt in enumerate(prompts):
        for i in range(options.n):
            index = prompt_index * options.n + i
            requests.append(
                GenerateRequest(
                    request_id=f"{request_id}-{index}",
                    prompt_token_ids=prompt.token_ids,
                    sampling=sampling_params(options, info, len(prompt.token_ids), i),
                    gateway_id=gateway_id,
                    arrival_time=now,
                    priority=options.priority,
                    cache_salt=options.cache_salt,
                    sample_group=(
                        f"{request_id}-p{prompt_index}"
                        if options.n > 1 and not options.beam_width
                        else None
                    ),
                )
            )
    return requests


def beam_leaders(requests: list[GenerateRequest], n: int) -> list[GenerateRequest]:
    """The requests the engine runs for `requests`' choices: all of them, or with beam search
    (whose one request per prompt returns n beams) each prompt's first."""
    if not requests or not requests[0].sampling.beam_width:
        return requests
    return requests[::n]
