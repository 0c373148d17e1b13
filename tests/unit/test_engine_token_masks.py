"""allowed_token_ids and bad_words through the engine (scheduler + model runner + sampler):
greedy outputs change exactly as the masks dictate, checked against transformers' own
masking logits processors on the same tiny model in fp32."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.engine import LLMEngine
from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.shared.protocol import GenerateRequest, SamplingParams
from tests.fixtures.hf_reference import load_hf
from tests.fixtures.tiny_models import TINY_VOCAB_SIZE
from tests.unit.test_engine import make_engine, random_prompts

MAX_TOKENS = 10


def greedy(**masks) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **masks)


@torch.inference_mode()
def hf_generate(model, prompt: list[int], **kwargs) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=MAX_TOKENS,
        do_sample=False,
        pad_token_id=0,
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> LLMEngine:
    return make_engine(tiny_llama_dir)


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    return load_hf(tiny_llama_dir)


PROMPTS = random_prompts((5, 12, 30), seed=3)


def test_allowed_token_ids_restrict_greedy_to_the_whitelist(engine, hf):
    free = [r.token_ids for r in engine.generate(PROMPTS, greedy())]
    for prompt, unmasked in zip(PROMPTS, free, strict=True):
        # a whitelist without the unmasked first pick, so the output must change
        allowed = sorted({unmasked[1], 7, 99, 200, 311} - {unmasked[0]})
        (result,) = engine.generate([prompt], greedy(allowed_token_ids=tuple(allowed)))
        assert set(result.token_ids) <= set(allowed)
        assert result.token_ids != unmasked
        assert result.token_ids == hf_generate(
            hf, prompt, prefix_allowed_tokens_fn=lambda _batch, _ids, allowed=allowed: allowed
        )


def test_bad_words_ban_a_word_at_the_point_it_would_complete(engine, hf):
    free = [r.token_ids for r in engine.generate(PROMPTS, greedy())]
    for prompt, unmasked in zip(PROMPTS, free, strict=True):
        one_token = (unmasked[0],)
        two_tokens = (unmasked[2], unmasked[3])  # banned only right after unmasked[2]
        assert prompt[-1] != unmasked[2]  # HF also looks into the prompt; vLLM does not
        (result,) = engine.generate([prompt], greedy(bad_words_token_ids=(one_token,)))
        assert unmasked[0] not in result.token_ids
        assert result.token_ids == hf_generate(hf, prompt, bad_words_ids=[list(one_token)])
        (result,) = engine.generate([prompt], greedy(bad_words_token_ids=(two_tokens,)))
        assert result.token_ids[:3] == unmasked[:3]
        assert result.token_ids[3] != unmasked[3]
        assert result.token_ids == hf_generate(hf, prompt, bad_words_ids=[list(two_tokens)])


def test_masked_and_unmasked_rows_share_a_batch(engine):
    free = [r.token_ids for r in engine.generate(PROMPTS, greedy())]
    params = [greedy(bad_words_token_ids=((free[0][0],),)), greedy(), greedy()]
    results = engine.generate(PROMPTS, params)
    assert results[0].token_ids[0] != free[0][0]
    assert [r.token_ids for r in results[1:]] == free[1:]


@pytest.mark.parametrize(
    "masks, named",
    [
        ({"allowed_token_ids": (1, TINY_VOCAB_SIZE)}, "allowed_token_ids"),
        ({"allowed_token_ids": ()}, "allowed_token_ids must not be empty"),
        ({"bad_words_token_ids": ((3, TINY_VOCAB_SIZE + 5),)}, "bad_words"),
        ({"bad_words_token_ids": ((),)}, "bad_words_token_ids"),
        ({"bad_words_token_ids": ((-1,),)}, "bad_words_token_ids"),
    ],
)
def test_bad_mask_values_are_rejected_naming_them(engine, masks, named):
    with pytest.raises(RequestRejectedError, match=named):
        engine.add_request(GenerateRequest("bad", [5, 6, 7], greedy(**masks)))
    assert not engine.has_unfinished_requests()
