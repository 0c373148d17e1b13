"""Where each request goes: the shared request stream, or one engine's routed stream, by the
policy of `--routing` (`route_choice.py` decides; this file gathers the facts and keeps count).

For one submission it reads, in one pipelined round trip, the length of every request stream
and, under the `cache` policy, which of the prompt's block digests each live engine's summary
holds (SMISMEMBER on the set that `services/scheduler/cache_publisher.py` keeps). Liveness and
reported load come from the gateway's status view (at most `REFRESH_INTERVAL_S` old). The
digests are `shared/block_hash.py`'s, over the prompt's full blocks at each engine's block
size, so they name the very keys the engine's prefix cache looks up.

Submissions are routed one at a time (`turn()`, held until the entries are queued): each then
sees the queue lengths its predecessors left, so a burst is spread instead of herding onto the
engine that looked least loaded when the burst began. A turn is waited for at most
`TURN_WAIT_S`: while Redis stalls, each submission would otherwise wait out every earlier one's
timeout; past it the submission routes on what it reads, one request of the burst less informed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pagedserve.services.gateway.recent_routes import RecentRoutes
from pagedserve.services.gateway.route_choice import Candidate, Choice, choose
from pagedserve.services.gateway.status_view import EngineStatusView
from pagedserve.shared.block_hash import max_hit_blocks, prefix_block_hashes
from pagedserve.shared.cache_summary import ROUTING_POLICIES, summary_member
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import GenerateRequest
from pagedserve.shared.status import EngineStatus, is_engine_live

logger = logging.getLogger(__name__)

TURN_WAIT_S = 1.0
SHARED_LABEL = "shared"  # the engine label of requests left to the shared stream


@dataclass(slots=True)
class RoutePlan:
    """One submission's routes: a stream per request, and the queue depth found."""

    streams: list[str]
    choices: list[Choice]
    queue_depth: int  # unfinished requests in every live request stream before these


@dataclass(slots=True)
class RoutingStats:
    """Totals since the gateway started, for /metrics."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (engine, reason)
    hit_tokens: Counter[str] = field(default_factory=Counter)  # engine -> prompt tokens found


class Router:
    def __init__(
        self, redis: aioredis.Redis, keys: RedisKeys, status_view: EngineStatusView, policy: str
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(
                f"routing must be one of {', '.join(ROUTING_POLICIES)}, got {policy!r}"
            )
        self.redis = redis
        self.keys = keys
        self.status_view = status_view
        self.policy = policy
        self._lock = asyncio.Lock()
        self.recent = RecentRoutes()
        self.stats = RoutingStats()

    async def plan(self, requests: Sequence[GenerateRequest]) -> RoutePlan:
        """Choose a stream for each request (raises RedisError). Call within `turn()`, and
        `commit` once the requests are queued."""
        live = await self._live_engines() if self.policy != "shared" else []
        members = [self._members(r, live) if self.policy == "cache" else {} for r in requests]
        depth, routed_lengths, held = await self._read(live, members)
        loads = {
            s.engine_id: max(s.num_running + s.num_waiting, n)
            for s, n in zip(live, routed_lengths, strict=True)
        }
        choices = []
        for i, request_members in enumerate(members):
            candidates = [
                Candidate(s.engine_id, loads[s.engine_id], s.num_free_blocks,
                          self._hit_tokens(s, request_members, held.get((i, s.engine_id))))
                for s in live
            ]  # fmt: skip
            choice = choose(self.policy, candidates)
            if choice.engine_id is not None:
                loads[choice.engine_id] += 1  # the next request of this submission sees it
                self._remember(choice.engine_id, live, request_members)
            choices.append(choice)
        streams = [self._stream(c) for c in choices]
        return RoutePlan(streams, choices, depth + sum(routed_lengths))

    async def _read(
        self, live: list[EngineStatus], members: list[dict[int, list[bytes]]]
    ) -> tuple[int, list[int], dict[tuple[int, str], list]]:
        """In one round trip: the shared stream's length, each live engine's routed stream's,
        and which of each request's blocks each engine's summary holds."""
        lookups = [  # (request index, engine): one SMISMEMBER each
            (i, status) for i, found in enumerate(members) for status in live
            if found.get(status.block_size)
        ]  # fmt: skip
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(self.keys.requests)
            for status in live:
                pipe.xlen(self.keys.routed_requests(status.engine_id))
            for i, status in lookups:
                summary = self.keys.cache_summary(status.engine_id)
                pipe.smismember(summary, members[i][status.block_size])
            answers = await pipe.execute()
        held = {
            (i, status.engine_id): found
            for (i, status), found in zip(lookups, answers[1 + len(live) :], strict=True)
        }
        return answers[0], answers[1 : 1 + len(live)], held

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """This submission's turn to route and queue (waited for at most `TURN_WAIT_S`)."""
        try:
            await asyncio.wait_for(self._lock.acquire(), TURN_WAIT_S)
        except TimeoutError:
            logger.debug("routing without a turn: the one before took over %gs", TURN_WAIT_S)
            yield
            return
        try:
            yield
        finally:
            self._lock.release()

    def commit(self, plan: RoutePlan) -> None:
        """The plan's requests are queued: count its decisions."""
        for choice in plan.choices:
            engine = choice.engine_id or SHARED_LABEL
            self.stats.decisions[(engine, choice.reason)] += 1
            self.stats.hit_tokens[engine] += choice.hit_tokens

    async def _live_engines(self) -> list[EngineStatus]:
        """The live engines, by the status view; none (the shared stream) while it is blind."""
        try:
            snapshot = await self.status_view.current()
        except RedisError as exc:
            logger.debug("routing to the shared stream: no engine status (%s)", exc)
            return []
        now = time.time()
        return [s for s in snapshot.statuses if is_engine_live(s, now) and s.block_size > 0]

    def _members(
        self, request: GenerateRequest, live: list[EngineStatus]
    ) -> dict[int, list[bytes]]:
        """Block size -> summary members of the prompt's blocks a cache hit may cover."""
        tokens = request.prompt_token_ids
        members: dict[int, list[bytes]] = {}
        for block_size in {s.block_size for s in live}:
            num_blocks = max_hit_blocks(len(tokens), block_size)
            hashes = prefix_block_hashes(tokens, block_size, num_blocks, request.cache_salt)
            members[block_size] = [summary_member(h) for h in hashes]
        return members

    def _hit_tokens(
        self, status: EngineStatus, members: dict[int, list[bytes]], held: list | None
    ) -> int:
        """Prompt tokens at its start that the engine holds, or was just sent by us."""
        found = members.get(status.block_size, [])
        now = time.monotonic()
        for i, member in enumerate(found):
            if not (held and held[i]) and not self.recent.was_sent(status.engine_id, member, now):
                return i * status.block_size
        return len(found) * status.block_size

    def _remember(
        self, engine_id: str, live: list[EngineStatus], members: dict[int, list[bytes]]
    ) -> None:
        block_size = next(s.block_size for s in live if s.engine_id == engine_id)
        self.recent.record(engine_id, members.get(block_size, []))

    def _stream(self, choice: Choice) -> str:
        if choice.engine_id is None:
            return self.keys.requests
        return self.keys.routed_requests(choice.engine_id)
