"""Bounds on what a request may ask, written once: the gateway validates client bodies
against them (and documents them in its OpenAPI document), the engine checks every queued
request against them again, and the sampler sizes its work by them."""

from __future__ import annotations

# vLLM's `max_logprobs`: top alternatives per sampled token (`logprobs`, chat's
# `top_logprobs`) and per prompt position (`prompt_logprobs`).
MAX_LOGPROBS = 20
MAX_PROMPT_LOGPROBS = MAX_LOGPROBS

# The widths of the integers a request carries: seeds are any int64 (as OpenAI and vLLM
# accept), counts (`max_tokens`, `min_tokens`, `top_k`) and `priority` fit an int32.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# OpenAI's `logit_bias`: each bias lies in [-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT].
LOGIT_BIAS_LIMIT = 100.0
