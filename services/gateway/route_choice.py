"""Which engine a request goes to, given what each live engine holds and how loaded it is: the
decision alone, with no I/O (`router.py` gathers the facts and sends the request).

Policies (`--routing`):
- `cache`: the engine holding the longest cached prefix of the prompt, among the engines not
  overloaded; a prompt no eligible engine holds goes to the least-loaded engine.
- `load`: the least-loaded engine.
- `shared`: no choice here; the request goes to the shared stream and the first engine with
  room takes it (the behaviour before routing).

An engine is overloaded when its load exceeds the least-loaded engine's by more than
`BALANCE_ABS` requests *and* by a factor over `BALANCE_REL` (SGLang's cache-aware router uses
the same two-threshold test): cache affinity wins until one engine would queue far more than
another, then load decides. Load is the larger of the engine's last reported running + waiting
and its routed stream's length (unfinished requests routed to it, live at decision time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BALANCE_ABS = 16  # requests
BALANCE_REL = 1.5

REASON_CACHE = "cache_hit"
REASON_LOAD = "least_loaded"
REASON_SHARED = "shared"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One live engine as the router sees it for one request."""

    engine_id: str
    load: int
    num_free_blocks: int
    hit_tokens: int  # prompt tokens at the start of the prompt that it holds (or was sent)


@dataclass(frozen=True, slots=True)
class Choice:
    engine_id: str | None  # None: the shared stream
    reason: str
    hit_tokens: int = 0


def is_overloaded(load: int, min_load: int) -> bool:
    return load > min_load + BALANCE_ABS and load > BALANCE_REL * min_load


def least_loaded(candidates: Sequence[Candidate]) -> Candidate:
    """Fewest requests; then most free blocks; then the engine id, so that ties are stable."""
    return min(candidates, key=lambda c: (c.load, -c.num_free_blocks, c.engine_id))


def choose(policy: str, candidates: Sequence[Candidate]) -> Choice:
    if policy == "shared" or not candidates:
        return Choice(None, REASON_SHARED)
    if policy == "load":
        return Choice(least_loaded(candidates).engine_id, REASON_LOAD)
    if policy != "cache":
        raise ValueError(f"unknown routing policy {policy!r}; expected cache, load or shared")
    min_load = min(c.load for c in candidates)
    eligible = [c for c in candidates if not is_overloaded(c.load, min_load)]
    best = max(eligible, key=lambda c: (c.hit_tokens, -c.load, c.engine_id))
    if best.hit_tokens > 0:
        return Choice(best.engine_id, REASON_CACHE, best.hit_tokens)
    return Choice(least_loaded(candidates).engine_id, REASON_LOAD)
