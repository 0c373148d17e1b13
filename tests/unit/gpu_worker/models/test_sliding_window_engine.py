"""A windowed model end to end: the worker reports each layer's window in its hello, the
scheduler gives back the blocks that slid out of every window while the request runs, and
the tokens stay Hugging Face's."""

from __future__ import annotations

from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import GenerateRequest, SamplingParams
from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.models.arch_check import random_prompts

WINDOW, BLOCK_SIZE, NUM_BLOCKS = 12, 4, 48


def test_blocks_outside_every_window_return_to_the_pool_on_a_long_generation(tmp_path):
    model_dir = build_tiny_model(tmp_path / "mistral", "mistral", sliding_window=WINDOW)
    engine = LLMEngine(
        model_dir,
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS),
        dtype="float32",
    )
    assert engine.scheduler.kv.sliding_window == WINDOW  # from the worker's hello
    prompt = random_prompts((30,), seed=5)[0]
    greedy = SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)
    engine.add_request(GenerateRequest("long", prompt, greedy))
    tokens, held = [], []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            tokens.extend(delta.token_ids)
        held.append(NUM_BLOCKS - engine.scheduler.kv.num_free_blocks)
    # 180 tokens would fill 45 blocks; the window and the block being filled need at most 5
    assert max(held[5:]) <= -(-WINDOW // BLOCK_SIZE) + 2, held
    assert engine.scheduler.kv.num_free_blocks == NUM_BLOCKS
    assert_matches_hf(tokens, hf_greedy(load_hf(model_dir), prompt, 150), "windowed")
