"""The default model in bf16 on the CPU, through every C kernel this CPU builds (few-row GEMM
on AMX or vdpbf16ps, RMSNorm, rotary, paged attention): greedy output stays the
model's (bf16 is not exact, so the first tokens, where HF's fp32 margins are wide, and the
answer), in one continuous batch and one request at a time."""

from __future__ import annotations

import pytest

from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.platforms.cpu import cpu_supports_bf16
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams
from tests.fixtures.hf_reference import hf_greedy, load_hf

TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, " * 6]
FIRST = 2  # tokens compared with HF's fp32 greedy: bf16 may flip a near-tie later on


@pytest.mark.skipif(not cpu_supports_bf16(), reason="bf16 runs natively only with AVX512-BF16")
def test_bf16_greedy_follows_the_model_batched_and_alone():
    from pagedserve.services.gpu_worker.default_model import ensure_default_model

    model_dir = ensure_default_model()
    engine = LLMEngine(
        "smollm2",
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=1024),
        CacheConfig(block_size=16, num_blocks=128),
        dtype="bfloat16",
    )
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    batched = engine.generate(TEXTS, greedy)
    alone = [engine.generate([text], greedy)[0] for text in TEXTS]
    hf = load_hf(model_dir)
    for together, single in zip(batched, alone, strict=True):
        ref = hf_greedy(hf, together.prompt_token_ids, FIRST)
        assert together.token_ids[:FIRST] == ref.token_ids, together.text
        assert single.token_ids[:FIRST] == ref.token_ids, single.text
    assert "Paris" in batched[0].text and "Paris" in alone[0].text
