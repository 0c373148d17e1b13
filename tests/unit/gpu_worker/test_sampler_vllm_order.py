"""The sampler's filters against a straightforward reference of vLLM's order (temperature,
min_p on the whole distribution, top_k, then top_p renormalized over what top_k kept), on real
SmolLM2 logits: the flat and peaked rows of a real model are where the order matters."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.sampler import SamplingRow, filter_logits
from pagedserve.shared.protocol import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "The best way to learn a language is",
    "1, 2, 3, 4,",
    "She opened the door and",
]
SETTINGS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 50, 0.9, 0.0),
    (0.7, 50, 0.9, 0.0),
    (1.0, 20, 0.5, 0.0),
    (1.0, -1, 0.8, 0.05),
    (1.3, 40, 0.7, 0.1),
    (1.0, 0, 0.95, 0.0),
    (0.8, 5, 1.0, 0.2),
]


def reference_filter(row: torch.Tensor, temperature: float, top_k: int, top_p: float,
                     min_p: float) -> torch.Tensor:  # fmt: skip
    """vLLM's order written out plainly for one row [V]: a bool mask of the kept tokens."""
    logits = row.double() / temperature
    if min_p > 0:
        probs = logits.softmax(-1)
        logits[probs < min_p * probs.max()] = float("-inf")
    ascending, order = logits.sort()
    if top_k > 0:
        ascending[: len(ascending) - top_k] = float("-inf")
    if top_p < 1.0:
        cumulative = ascending.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[-1] = False
        ascending[drop] = float("-inf")
    kept = torch.zeros_like(row, dtype=torch.bool)
    kept[order] = ascending.isfinite()
    return kept


@pytest.fixture(scope="module")
def smollm2_logits() -> torch.Tensor:
    """[R, V] float32 next-token logits at every position of a few prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pagedserve.services.gpu_worker.default_model import ensure_default_model

    model_dir = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer.encode(prompt)])
            rows.append(model(ids).logits[0].float())  # [S, V]
    return torch.cat(rows)


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), SETTINGS)
def test_filters_keep_exactly_what_vllm_keeps(smollm2_logits, temperature, top_k, top_p, min_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rows = [SamplingRow(params, [], []) for _ in range(len(smollm2_logits))]
    kept = filter_logits(smollm2_logits, rows).isfinite()
    for i, logits in enumerate(smollm2_logits):
        expected = reference_filter(logits, temperature, top_k, top_p, min_p)
        differ = (kept[i] != expected).nonzero().flatten().tolist()
        assert not differ, f"row {i}: tokens {differ[:10]} kept by one side only"


def test_top_p_is_measured_after_top_k(smollm2_logits):
    """The bug this order fixes: with top_k 50 / top_p 0.9, measuring top_p on the whole row
    keeps tokens that vLLM drops. Some real rows must show the difference."""
    params = SamplingParams(top_k=50, top_p=0.9)
    rows = [SamplingRow(params, [], []) for _ in range(len(smollm2_logits))]
    kept = filter_logits(smollm2_logits, rows).isfinite().sum(-1)
    whole_row = []
    for logits in smollm2_logits:
        values = logits.sort(descending=True).values
        probs = values.softmax(-1)
        keep = ((probs.cumsum(-1) - probs) < 0.9) & (torch.arange(len(values)) < 50)
        whole_row.append(int(keep.sum()))
    assert any(k < w for k, w in zip(kept.tolist(), whole_row, strict=True))
