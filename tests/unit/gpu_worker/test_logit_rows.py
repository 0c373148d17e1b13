"""The modules' forward pass given the rows a step samples from (`DecoderLM.forward`'s
`logit_rows`): the last layer goes on past attention with those rows only, which keep the
full pass's values, the others come back zero, and every row's keys and values are cached.
A model whose last layer cannot select rows computes them all. (The fused CPU pass's form is
tested in `test_cpu_fused_forward*.py`; every architecture's HF-exactness test runs it too.)"""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.fused_forward_checks import BLOCK_SIZE, two_steps

ROWS = [torch.tensor([28, 19]), torch.tensor([6, 4, 5, 7, 8, 9])]  # last rows; drafts


def _engine(tmp_path, arch: str) -> LLMEngine:
    return LLMEngine(
        build_tiny_model(tmp_path / arch, arch),
        SchedulerConfig(max_model_len=512),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
        dtype="float32",
        device="cpu",
    )


def _fresh_caches(engine: LLMEngine) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mixtral"])
def test_the_kept_rows_are_the_full_pass_and_the_others_zero(tmp_path, arch):
    engine = _engine(tmp_path, arch)
    model = engine.runner.model
    assert model.takes_logit_rows
    caches = _fresh_caches(engine)
    full_caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        for (tokens, positions, metadata), rows in zip(
            two_steps(model.config.vocab_size, 20), ROWS, strict=True
        ):
            full = model(tokens, positions, full_caches, metadata)
            some = model(tokens, positions, caches, metadata, logit_rows=rows)
            assert some.shape == full.shape
            torch.testing.assert_close(some[rows], full[rows], rtol=1e-5, atol=1e-6)
            others = torch.ones(len(tokens), dtype=torch.bool)
            others[rows] = False
            assert not some[others].any()
    for (k, v), (fk, fv) in zip(caches, full_caches, strict=True):
        assert torch.equal(k, fk) and torch.equal(v, fv)


def test_a_model_whose_last_layer_cannot_select_rows_computes_every_row(tmp_path):
    engine = _engine(tmp_path, "olmo2")  # post-norm layers: no `keep`
    model = engine.runner.model
    assert not model.takes_logit_rows
    tokens, positions, metadata = two_steps(model.config.vocab_size, 20)[0]
    caches = _fresh_caches(engine)
    with torch.inference_mode():
        full = model(tokens, positions, [(k.clone(), v.clone()) for k, v in caches], metadata)
        some = model(tokens, positions, caches, metadata, logit_rows=ROWS[0])
    assert torch.equal(some, full)


def test_the_runner_passes_its_rows_unless_prompt_logprobs_read_them_all(tmp_path):
    """The model runner hands a forward pass that takes them the rows it samples from, and
    none where a request's prompt logprobs need every prompt row (whose values against HF's
    are `test_prompt_logprobs.py`'s)."""
    engine = _engine(tmp_path, "llama")
    model, passed = engine.runner.model, []

    def recording(*args, logit_rows=None):
        passed.append(logit_rows is not None)
        return model(*args, logit_rows=logit_rows)

    recording.takes_logit_rows = True
    engine.runner.forward_pass = recording
    prompt = list(range(5, 40))
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.generate([prompt], greedy)
    assert passed and all(passed)
    passed.clear()
    engine.reset_prefix_cache()
    engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))
    assert passed == [False]  # the prompt's one step
