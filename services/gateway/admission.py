"""Cheap refusals, before the expensive work: a request that cannot be served is refused for
what it costs to look at it, never after tokenizing megabytes or fanning out a thousand
sequences. A text prompt's size bounds its token count from below (`token_bound.py`): a text
whose bound already exceeds the model's length gets the same 400 as a prompt found too long
after tokenizing.
"""

from __future__ import annotations

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.openai_schema import ChatRequest, CompletionRequest
from pagedserve.services.gateway.token_bound import min_num_tokens
from pagedserve.services.gateway.tokenizer import TokenizerInfo

# Below this many characters tokenizing costs about a millisecond, so the exact count decides
# (and the error gives it, in vLLM's words); the bound from the size is for the big ones.
EXACT_BELOW_CHARS = 64 * 1024


def check_text_fits(
    text: str,
    bytes_per_token: int | None,
    max_model_len: int,
    max_tokens: int | None,
    prompt_param: str = "prompt",
    max_tokens_param: str = "max_tokens",
    vanishing: str = "",
) -> None:
    """A 400, before tokenizing, for a text of `EXACT_BELOW_CHARS` or more that cannot fit
    `max_model_len` however it tokenizes, or whose `max_tokens` alone exceeds it."""
    if bytes_per_token is None or len(text) < EXACT_BELOW_CHARS:
        return
    num_min = min_num_tokens(text, bytes_per_token, vanishing)
    if num_min >= max_model_len:
        raise bad_request(
            f"the prompt has at least {num_min} tokens ({len(text)} characters, no token "
            f"longer than {bytes_per_token} bytes), which leaves no room in this model's "
            f"maximum context length of {max_model_len} tokens",
            prompt_param,
        )
    if max_tokens is not None and max_tokens > max_model_len:
        raise bad_request(
            f"this model's maximum context length is {max_model_len} tokens, but "
            f"{max_tokens} were requested for `{max_tokens_param}`",
            max_tokens_param,
        )


def check_num_sequences(num_prompts: int, n: int, limit: int) -> None:
    """A 400 when one request asks for more sequences (prompts x n) than `limit`."""
    if num_prompts * n > limit:
        raise bad_request(
            f"this request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} "
            f"sequences; the limit is {limit} per request (--max-seqs-per-request)",
            "n",
        )


def admit_completion(request: CompletionRequest, info: TokenizerInfo, max_seqs: int) -> None:
    """What a completion request can be refused for before any tokenizing."""
    check_num_sequences(len(request.prompts), request.sampling.n, max_seqs)
    for prompt in request.prompts:
        if isinstance(prompt, str):  # token id lists are checked exactly, for free, later
            check_text_fits(
                prompt,
                info.max_bytes_per_token,
                info.max_model_len,
                request.sampling.max_tokens,
                vanishing=info.vanishing_chars,
            )


def admit_chat(request: ChatRequest, max_seqs: int) -> None:
    """What a chat request can be refused for before rendering its template; the rendered
    text is size-checked before tokenizing (`request_builder.tokenize_chat`)."""
    check_num_sequences(1, request.sampling.n, max_seqs)
