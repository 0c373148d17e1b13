"""Sampler: each parameter's effect on synthetic logits, seeds, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from pagedserve.kernels import cpu_argmax
from pagedserve.services.gpu_worker import sampler
from pagedserve.services.gpu_worker.layers.argmax import Argmax
from pagedserve.services.gpu_worker.sampler import (
    SamplingRow,
    apply_penalties,
    inverse_cdf_sample,
    sample,
)
from pagedserve.shared.protocol import SamplingParams

VOCAB = 64


def make_logits(batch: int = 1, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((batch, VOCAB), generator=generator) * 3  # [B, V]


def row(prompt=(), output=(), **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(prompt), list(output))


def draw(logits: torch.Tensor, n: int, **params) -> list[int]:
    """n draws from one row's distribution (unseeded rows share the global generator)."""
    return sample(logits.expand(n, -1).contiguous(), [row(**params) for _ in range(n)]).token_ids


def test_greedy_is_argmax_per_row():
    logits = make_logits(4)
    out = sample(logits, [row(temperature=0.0) for _ in range(4)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs is None and out.top_logprobs is None


def test_top_k_1_and_tiny_top_p_equal_greedy():
    logits = make_logits(1, seed=1)
    best = int(logits.argmax())
    assert set(draw(logits, 200, temperature=1.5, top_k=1)) == {best}
    assert set(draw(logits, 200, temperature=1.5, top_p=1e-6)) == {best}


def test_top_k_limits_the_support():
    logits = make_logits(1, seed=2)
    allowed = set(logits[0].topk(5).indices.tolist())
    drawn = set(draw(logits, 2000, temperature=5.0, top_k=5))
    assert drawn <= allowed and len(drawn) == 5


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0] + [-20.0] * (VOCAB - 5)])
    probs = logits.softmax(-1)[0]
    assert float(probs[:2].sum()) < 0.9 < float(probs[:3].sum())
    assert set(draw(logits, 2000, top_p=0.9)) == {0, 1, 2}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (VOCAB - 4)]))
    # min_p=0.2: threshold 0.1, so tokens 0..2 stay and 3 (0.05) goes.
    assert set(draw(logits, 3000, min_p=0.2)) == {0, 1, 2}


def test_temperature_spreads_the_distribution():
    logits = make_logits(1, seed=3)
    cold = draw(logits, 1000, temperature=0.2)
    hot = draw(logits, 1000, temperature=2.0)
    assert len(set(hot)) > len(set(cold))
    best = int(logits.argmax())
    assert cold.count(best) > hot.count(best)


def test_sampling_frequencies_follow_softmax():
    logits = torch.tensor([[1.0, 0.0, -1.0] + [-30.0] * (VOCAB - 3)])
    counts = torch.bincount(torch.tensor(draw(logits, 6000)), minlength=VOCAB)[:3].float() / 6000
    expected = logits[0, :3].softmax(-1)
    torch.testing.assert_close(counts, expected, atol=0.03, rtol=0)


def test_seed_reproduces_regardless_of_batch_and_position():
    logits = make_logits(3, seed=4)
    seeded = dict(temperature=1.0, seed=1234, output=[7, 8])
    alone = sample(logits[1:2], [row(**seeded)]).token_ids[0]
    rows = [row(temperature=1.0), row(**seeded), row(temperature=0.7)]
    for _ in range(5):
        assert sample(logits, rows).token_ids[1] == alone
    moved = sample(logits[[1, 0]], [row(**seeded), row(temperature=1.0)])
    assert moved.token_ids[0] == alone


def test_different_seeds_and_steps_give_different_draws():
    logits = torch.zeros((1, VOCAB))  # uniform: any repeat across 20 draws would be chance
    picks = {sample(logits, [row(seed=s)]).token_ids[0] for s in range(20)}
    assert len(picks) > 10
    steps = {sample(logits, [row(seed=5, output=[1] * n)]).token_ids[0] for n in range(20)}
    assert len(steps) > 10


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0] + [0.0] * (VOCAB - 4)])
    out = apply_penalties(logits, [row(prompt=[0], output=[1], repetition_penalty=2.0)])
    assert out[0, :4].tolist() == [1.0, -4.0, 2.0, -2.0]


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros((1, VOCAB))
    r = row(prompt=[5, 5], output=[3, 3, 3, 4], presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, [r])
    assert out[0, 3].item() == pytest.approx(-(0.5 + 3 * 0.25))
    assert out[0, 4].item() == pytest.approx(-(0.5 + 0.25))
    assert out[0, 5].item() == 0.0  # prompt tokens are not penalised by presence/frequency


def test_penalty_changes_the_greedy_pick():
    logits = torch.tensor([[5.0, 4.0] + [0.0] * (VOCAB - 2)])
    assert sample(logits, [row(temperature=0.0, output=[0])]).token_ids == [0]
    penalised = sample(logits, [row(temperature=0.0, output=[0], frequency_penalty=2.0)])
    assert penalised.token_ids == [1]


def test_min_tokens_blocks_eos_and_stop_tokens_until_reached():
    logits = torch.tensor([[9.0, 8.0, 7.0] + [0.0] * (VOCAB - 3)])
    params = dict(temperature=0.0, min_tokens=2, max_tokens=5, eos_token_ids=(0,))
    assert sample(logits, [row(**params, stop_token_ids=(1,))]).token_ids == [2]
    assert sample(logits, [row(**params, output=[4, 4])]).token_ids == [0]


def allow_only(token_ids: list[int], vocab: int) -> torch.Tensor:
    """A one-row xgrammar-layout bitmask [1, ceil(V / 32)] allowing only `token_ids`."""
    bits = torch.zeros(-(-vocab // 32) * 32, dtype=torch.int64)
    bits[token_ids] = 1
    words = (bits.view(-1, 32) << torch.arange(32)).sum(-1)
    return ((words + 2**31) % 2**32 - 2**31).to(torch.int32).unsqueeze(0)


def test_min_tokens_keeps_a_grammar_from_ending_early_unless_it_is_complete():
    from pagedserve.services.gpu_worker.sampler import AllowedTokens

    logits = torch.tensor([[9.0, 8.0, 7.0] + [0.0] * (VOCAB - 3)])
    params = dict(temperature=0.0, min_tokens=3, max_tokens=5, eos_token_ids=(0,))
    may_end = AllowedTokens([0], allow_only([0, 2], VOCAB))  # EOS or token 2
    assert sample(logits, [row(**params)], may_end).token_ids == [2]
    assert sample(logits, [row(**params, output=[2, 2, 2])], may_end).token_ids == [0]
    complete = AllowedTokens([0], allow_only([0], VOCAB))  # nothing but EOS is left
    assert sample(logits, [row(**params)], complete).token_ids == [0]


def test_logprobs_are_of_the_raw_distribution_with_top_alternatives():
    logits = make_logits(2, seed=5)
    out = sample(logits, [row(temperature=0.5, logprobs=3), row(temperature=0.0)])
    raw = logits.log_softmax(-1)
    assert out.logprobs is not None and out.top_logprobs is not None
    for i, token in enumerate(out.token_ids):
        assert out.logprobs[i] == pytest.approx(float(raw[i, token]), abs=1e-5)
    best = raw[0].topk(3)
    assert [t for t, _ in out.top_logprobs[0]] == best.indices.tolist()
    assert all(
        math.isclose(v, float(b), abs_tol=1e-5)
        for (_, v), b in zip(out.top_logprobs[0], best.values, strict=True)
    )
    assert out.top_logprobs[1] == []  # the second row asked for none


def test_inverse_cdf_maps_each_uniform_to_the_token_whose_interval_holds_it():
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]]).repeat(6, 1)
    uniforms = torch.tensor([[0.0], [0.1], [0.2], [0.69], [0.7], [0.999]])
    # Intervals: token 0 [0, 0.2), token 1 empty, token 2 [0.2, 0.7), token 3 [0.7, 1).
    assert inverse_cdf_sample(probs, uniforms).tolist() == [0, 0, 2, 2, 3, 3]


def test_inverse_cdf_never_picks_a_token_without_mass_at_either_end():
    probs = torch.tensor([[0.0, 0.0, 0.6, 0.4, 0.0, 0.0]]).repeat(2, 1)
    # u = 0 must skip the empty head; u * total rounding up to the total (u = 1 here) must
    # not run past the last token with mass into the empty tail.
    uniforms = torch.tensor([[0.0], [1.0]])
    assert inverse_cdf_sample(probs, uniforms).tolist() == [2, 3]


def full_sort_top_k_top_p(logits, top_k, top_p):
    """The definition: sort each whole row, keep ranks < top_k, then the smallest set of those
    whose mass, renormalized over what top_k kept, reaches top_p."""
    out = torch.full_like(logits, float("-inf"))
    for i, (k, p) in enumerate(zip(top_k, top_p, strict=True)):
        values, order = logits[i].sort(descending=True)
        in_k = torch.arange(len(values)) < k
        probs = values.masked_fill(~in_k, float("-inf")).softmax(-1)
        keep = in_k & (((probs.cumsum(-1) - probs) < p) | (p >= 1.0))
        keep[0] = True
        out[i, order[keep]] = values[keep]
    return out


def test_top_k_top_p_on_candidates_equals_the_full_sort(monkeypatch):
    monkeypatch.setattr(sampler, "TOP_CANDIDATES", (4, 16))  # VOCAB 64: all three passes
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn((12, VOCAB), generator=generator) * torch.tensor([[0.3], [3.0]]).repeat(
        6, 1
    )  # flat rows need a wide nucleus, peaked ones a narrow one
    top_k = [VOCAB, 3, VOCAB, 10, VOCAB, 40, VOCAB, VOCAB, 2, VOCAB, 64, 5]
    top_p = [0.9, 1.0, 0.5, 0.95, 0.99, 1.0, 0.2, 0.999, 0.9, 0.7, 0.6, 0.3]
    expected = full_sort_top_k_top_p(logits, top_k, top_p)
    assert torch.equal(sampler.apply_top_k_top_p(logits, top_k, top_p), expected)


def test_top_k_0_means_disabled_in_the_engine_api():
    SamplingParams(top_k=0).validate()
    logits = make_logits()
    assert len(set(draw(logits, 3000, temperature=5.0, top_k=0))) > 30


def test_temperature_below_1e_5_is_greedy():
    logits = make_logits(batch=2, seed=3)
    rows = [row(temperature=1e-6), row(temperature=9e-6)]
    assert all(r.params.is_greedy for r in rows)
    assert sample(logits, rows).token_ids == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=1e-5).is_greedy


def test_logit_bias_is_added_before_sampling_and_logprobs_stay_raw():
    logits = make_logits()
    worst = int(logits[0].argmin())
    out = sample(logits, [row(temperature=0, logit_bias=((worst, 100.0),), logprobs=0)])
    assert out.token_ids == [worst]
    assert out.logprobs[0] == pytest.approx(float(logits[0].log_softmax(-1)[worst]), abs=1e-5)
    banned = int(logits[0].argmax())
    assert banned not in draw(logits, 500, logit_bias=((banned, -100.0),))


def test_negative_int64_seeds_reproduce_and_differ_from_their_unsigned_twin():
    logits = make_logits(batch=1).expand(64, -1).contiguous()

    def draws(seed: int) -> list[int]:
        return sample(logits, [row(temperature=5.0, seed=seed + i) for i in range(64)]).token_ids

    assert draws(-(2**63)) == draws(-(2**63))
    assert draws(-1) != draws(2**63 - 1)


def test_allowed_tokens_mask_exactly_the_forbidden_tokens_of_their_rows():
    from pagedserve.services.gpu_worker.sampler import AllowedTokens, apply_allowed_tokens

    vocab, rows = 70, [1, 3]  # a vocabulary that does not fill its last 32-bit word
    logits = torch.randn(4, vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (2, 3), dtype=torch.int32)
    masked = apply_allowed_tokens(logits, AllowedTokens(rows, bitmask))
    bits = ((bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten(1)
    for i, row in enumerate(rows):
        expected = logits[row].masked_fill(bits[i, :vocab] == 0, float("-inf"))
        assert torch.equal(masked[row], expected)
    assert torch.equal(masked[[0, 2]], logits[[0, 2]])  # unconstrained rows untouched
    assert torch.isfinite(logits).all()  # the caller's logits are not modified


def test_bf16_logits_give_what_their_float32_gives_on_every_path():
    """compute_logits hands bf16 logits over as they are: greedy rows that only take the
    argmax read them directly, any other batch is widened first; either way, the tokens and
    logprobs of the float32 copy."""
    logits = make_logits(4, seed=7).to(torch.bfloat16)
    widened = logits.float()
    batches = [
        [row(temperature=0.0) for _ in range(4)],  # the argmax only
        [row(temperature=0.0, logprobs=2) for _ in range(4)],
        [row(temperature=0.0, output=[int(widened[0].argmax())], repetition_penalty=3.0)]
        + [row(temperature=0.0) for _ in range(3)],
        [row(temperature=0.0, logit_bias=((5, 50.0),))] + [row(temperature=0.0)] * 3,
        [row(temperature=0.0, min_tokens=3, eos_token_ids=(int(widened[1].argmax()),))] * 4,
        [row(temperature=0.8, seed=3) for _ in range(4)],
    ]
    for rows in batches:
        assert sample(logits, rows) == sample(widened, rows)


def test_the_argmax_only_batch_skips_widening(monkeypatch):
    logits = make_logits(3, seed=8).to(torch.bfloat16)
    monkeypatch.setattr(
        torch.Tensor, "float", lambda self: pytest.fail("widened an argmax-only batch")
    )
    expected = Argmax(form="cpu")(logits).tolist()
    assert sample(logits, [row(temperature=0.0)] * 3).token_ids == expected


def test_argmax_forms_agree_and_the_cpu_form_without_the_kernel_is_torchs(monkeypatch):
    logits = make_logits(5, seed=9).to(torch.bfloat16)
    cpu_form, native = Argmax(form="cpu"), Argmax(form="native")
    with_kernel = cpu_form(logits)
    assert torch.equal(with_kernel, native(logits))
    monkeypatch.setenv("PAGEDSERVE_CPU_ARGMAX_KERNEL", "0")
    cpu_argmax.load.cache_clear()
    try:
        assert torch.equal(cpu_form(logits), logits.float().argmax(-1))
        assert torch.equal(with_kernel, logits.float().argmax(-1))
    finally:
        cpu_argmax.load.cache_clear()
