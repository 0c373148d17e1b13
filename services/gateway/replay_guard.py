"""Exactly-once output for one choice across engine crashes.

A request whose scheduler died before finishing it is run again from its prompt (by the same
engine id after a restart, or by another engine that claims it), so its tokens arrive a second
time from position 0. Every `TokenDelta` says how many output tokens its request has in total
(`num_output_tokens`, counting a stop token that is not in `token_ids`), so the position of
its first token is known. The guard keeps the ids already shown, drops the replayed prefix,
and checks that the replay agrees with what was shown: at temperature 0 (or with a seed) it
does, and the client never sees the restart. A replay that disagrees (unseeded sampling) or
skips positions cannot be stitched into a coherent text, so it is an error, never silent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pagedserve.shared.protocol import TokenDelta


class ReplayMismatch(ValueError):
    """A delta that cannot continue what the client has already been shown."""


@dataclass(slots=True)
class ReplayGuard:
    shown_token_ids: list[int] = field(default_factory=list)  # output ids passed on so far
    num_replayed_tokens: int = 0  # tokens dropped as duplicates (for tests and logs)

    def admit(self, delta: TokenDelta) -> TokenDelta:
        """`delta` without the tokens already shown. Raises `ReplayMismatch` if it disagrees
        with them or leaves a gap."""
        num_stop = 1 if delta.stop_token_id is not None else 0
        num_tokens = len(delta.token_ids)
        if not num_tokens and not num_stop:
            return delta  # nothing positional: progress counters, abort, error
        start = delta.num_output_tokens - num_tokens - num_stop
        num_shown = len(self.shown_token_ids)
        if start < 0:  # a sender that does not count positions (scripted test engines)
            self.shown_token_ids.extend(delta.token_ids)
            return delta
        if start > num_shown:
            raise ReplayMismatch(
                f"output tokens {num_shown}..{start - 1} of {delta.request_id} never arrived"
            )
        overlap = min(num_tokens, num_shown - start)
        if delta.token_ids[:overlap] != self.shown_token_ids[start : start + overlap]:
            raise ReplayMismatch(
                f"the engine restarted {delta.request_id} and regenerated different tokens "
                "(sampling without a seed); the output shown so far cannot be continued"
            )
        if num_stop and start + num_tokens < num_shown:
            raise ReplayMismatch(
                f"the engine restarted {delta.request_id} and it stopped earlier than the "
                "output shown so far"
            )
        self.shown_token_ids.extend(delta.token_ids[overlap:])
        if overlap == 0:
            return delta
        self.num_replayed_tokens += overlap
        return _drop_first(delta, overlap)


def _drop_first(delta: TokenDelta, count: int) -> TokenDelta:
    return dataclasses.replace(
        delta,
        token_ids=delta.token_ids[count:],
        logprobs=None if delta.logprobs is None else delta.logprobs[count:],
        top_logprobs=None if delta.top_logprobs is None else delta.top_logprobs[count:],
    )
