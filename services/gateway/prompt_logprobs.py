"""Prompt logprobs in the two shapes clients read.

- vLLM's `prompt_logprobs`: one entry per prompt token, `None` for the first (nothing predicts
  it), else `{"<token id>": {"logprob", "rank", "decoded_token"}}` holding the prompt token and
  the k most likely tokens at that position.
- The completions API's `echo` with `logprobs`: the prompt's tokens lead the usual parallel
  arrays, the first with `null` logprob and `null` top_logprobs (what lm-evaluation-harness's
  loglikelihood reads: `token_logprobs[ctxlen:]`). Text offsets are cumulative token-text
  lengths, as vLLM computes them.
"""

from __future__ import annotations

from typing import Any

from pagedserve.services.gateway.logprob_formatter import clamp
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from pagedserve.shared.protocol import PromptLogprobs


def _entry(
    info: TokenizerInfo, token_id: int, logprob: float, rank: int, context: list[int]
) -> dict[str, Any]:
    decoded = info.token_text_after(token_id, context)
    return {"logprob": clamp(logprob), "rank": rank, "decoded_token": decoded}


def vllm_prompt_logprobs(
    info: TokenizerInfo, prompt_ids: list[int], logprobs: PromptLogprobs | None, k: int
) -> list[dict[str, Any] | None] | None:
    if logprobs is None:
        return None
    out: list[dict[str, Any] | None] = [None]
    for i, token_id in enumerate(prompt_ids[1:]):
        context = prompt_ids[: i + 1]  # the prompt before this position
        position = {str(token_id): _entry(info, token_id, logprobs.token_logprobs[i],
                                          logprobs.ranks[i], context)}  # fmt: skip
        for rank, (top_id, value) in enumerate(logprobs.top_logprobs[i][:k], start=1):
            position.setdefault(str(top_id), _entry(info, top_id, value, rank, context))
        out.append(position)
    return out


def echo_completion_logprobs(
    info: TokenizerInfo, prompt_ids: list[int], logprobs: PromptLogprobs | None, k: int
) -> dict[str, Any]:
    """The prompt's part of a completions `logprobs` object (echo)."""
    tokens = [info.token_text_after(t, prompt_ids[:i]) for i, t in enumerate(prompt_ids)]
    offsets, total = [], 0
    for token in tokens:
        offsets.append(total)
        total += len(token)
    token_logprobs: list[float | None] = [None]
    top_logprobs: list[dict[str, float] | None] = [None]
    for i, token in enumerate(tokens[1:]):
        value = clamp(logprobs.token_logprobs[i]) if logprobs else 0.0
        top = {token: value}
        for top_id, top_value in logprobs.top_logprobs[i][:k] if logprobs else []:
            top.setdefault(info.token_text_after(top_id, prompt_ids[: i + 1]), clamp(top_value))
        token_logprobs.append(value)
        top_logprobs.append(top)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}  # fmt: skip


def prepend_echo(echo: dict[str, Any], generated: dict[str, Any] | None) -> dict[str, Any]:
    """One logprobs object: the prompt's entries, then the generated ones (offsets shifted)."""
    if generated is None:
        return echo
    shift = sum(len(t) for t in echo["tokens"])
    return {
        "tokens": echo["tokens"] + generated["tokens"],
        "token_logprobs": echo["token_logprobs"] + generated["token_logprobs"],
        "top_logprobs": echo["top_logprobs"] + generated["top_logprobs"],
        "text_offset": echo["text_offset"] + [o + shift for o in generated["text_offset"]],
    }
