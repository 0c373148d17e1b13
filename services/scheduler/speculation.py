"""Which sequences get draft tokens in a step, and how many (n-gram speculative decoding).

A sequence in decode (its last sampled token is all it has to compute) gets up to
`num_speculative_tokens` drafts from `propose_ngram` when its output is greedy, free text
and without logprobs: the workers then compute its last token and the drafts in one step,
sample (greedily) after each of them, and keep the longest run of drafts that matched
what they sampled, plus the token sampled after that run. The output is exactly what
one token per step would give. Sampled or constrained sequences, and those asking for
logprobs, never get drafts. Sequences still short of `min_tokens` do: the workers sample
after each draft with the history it implies, so EOS and stop tokens stay masked exactly
where one token per step would mask them (benchmark clients send `min_tokens` equal to
`max_tokens` with `ignore_eos`: had they no drafts, speculation would never run there).

Steps that run more than `speculative_max_num_seqs` sequences get none: on a CPU every row
of a step costs a pass of arithmetic over all the weights, so drafts pay only while most of
them are accepted or the step is bound by reading the weights. The default, 32, was measured
against 8 on the 48-request benchmark in-process with every request at once (2 threads,
K = 3): AVX2 fp32 took 43-48 s against 58-76, bf16 16.8 s against 24-25 (64: 18.7). (Service
runs before drafts were allowed under `min_tokens` drafted nothing, whatever they were set
to: their differences were the VM's.)
"""

from __future__ import annotations

from pagedserve.services.scheduler.ngram_proposer import propose_ngram
from pagedserve.services.scheduler.request import Request


def can_speculate(request: Request) -> bool:
    sampling = request.sampling
    return sampling.is_greedy and sampling.structured_output is None and sampling.logprobs is None


def draft_tokens(
    request: Request, num_speculative_tokens: int, max_model_len: int, vocab_size: int = 0
) -> list[int]:
    """Drafts to follow `request`'s tokens: no more than can become output within its
    `max_tokens` and the model length (`vocab_size` > 0: a count may go on, below it)."""
    room = min(
        num_speculative_tokens,
        request.max_next_drafts,
        request.sampling.max_tokens - request.num_output_tokens - 1,
        max_model_len - request.num_tokens,
    )
    if room <= 0 or not can_speculate(request):
        return []
    return propose_ngram(request.all_token_ids, room, vocab_size=vocab_size)


def next_max_drafts(num_drafts: int, num_after_first: int) -> int:
    """How many drafts a sequence may have next time, after `num_drafts` of which the workers
    returned `num_after_first` tokens beyond the first (the accepted drafts, then the token
    sampled after them): one more than the run accepted, so all right grows by one and all
    wrong drops to one. A sequence whose text has stopped repeating its n-grams costs its
    steps one extra row, not `num_speculative_tokens`."""
    return min(num_after_first, num_drafts) + 1
