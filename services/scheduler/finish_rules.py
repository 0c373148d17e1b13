"""When a sequence is done, following OpenAI/vLLM semantics."""

from __future__ import annotations

from pagedserve.services.scheduler.request import Request

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
FINISH_ERROR = "error"


def check_stop(request: Request, token_id: int, max_model_len: int) -> tuple[str | None, bool]:
    """Called after `token_id` was appended. Returns (finish_reason or None, whether the token
    is a stop token, which is counted as output but not shown).

    EOS (unless `ignore_eos`) and `stop_token_ids` cannot stop a sequence before `min_tokens`
    outputs; `max_tokens` and `max_model_len` always can.
    """
    sampling = request.sampling
    num_output = request.num_output_tokens
    if num_output >= sampling.min_tokens and (
        (not sampling.ignore_eos and token_id in sampling.eos_token_ids)
        or token_id in sampling.stop_token_ids
    ):
        return FINISH_STOP, True
    if num_output >= sampling.max_tokens or request.num_tokens >= max_model_len:
        return FINISH_LENGTH, False
    return None, False
