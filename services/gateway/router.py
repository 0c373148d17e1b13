"""Where each request goes: the shared request stream, or one engine's routed stream, by the
policy of `--routing` (`route_choice.py` decides; this file gathers the facts and keeps count).

For one submission it reads, in one pipelined round trip, the length of every request stream
and, under the `cache` policy, which of the prompt's block digests each live engine's summary
holds (SMISMEMBER on the set that `services/scheduler/cache_publisher.py` keeps). Liveness and
reported load come from the gateway's status view (at most `REFRESH_INTERVAL_S` old). The
digests are `shared/block_hash.py`'s, over the prompt's full blocks at each engine's block
size, so they name the very keys the engine's prefix cache looks up.

Submissions are routed one at a time (`lock`, held until the entries are queued): each then
sees the queue lengths its predecessors left, so a burst is spread instead of herding onto the
engine that looked least loaded when the burst began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
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
        self.lock = asyncio.Lock()
        self.recent = RecentRoutes()
        self.stats = RoutingStats()

    async def plan(self, requests: Sequence[GenerateRequest]) -> RoutePlan:
        """Choose a stream for each request (raises RedisError). Call under `lock`, and
        `commit` once the requests are queued."""
        live = await self._live_engines() if self.policy != "shared" else []
        members = [self._members(r, live) for r in requests] if self.policy == "cache" else []
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(self.keys.requests)
            for status in live:
                pipe.xlen(self.keys.routed_requests(status.engine_id))
            for request_members in members:
                for status in live:
                    found = request_members.get(status.block_size, [])
                    if found:
                        pipe.smismember(self.keys.cache_summary(status.engine_id), found)
            answers = await pipe.execute()
        depth, routed_lengths, rest = (
            answers[0],
            answers[1 : 1 + len(live)],
            answers[1 + len(live) :],
        )
        loads = {
            s.engine_id: max(s.num_running + s.num_waiting, n)
            for s, n in zip(live, routed_lengths, strict=True)
        }
        choices = []
        held = iter(rest)
        for i in range(len(requests)):
            candidates = []
            for status in live:
                found = members[i].get(status.block_size, []) if members else []
                hits = next(held) if found else []
                num_blocks = self._leading_hits(status.engine_id, found, hits)
                candidates.append(
                    Candidate(status.engine_id, loads[status.engine_id], status.num_free_blocks,
                              num_blocks * status.block_size)
                )  # fmt: skip
            choice = choose(self.policy, candidates)
            if choice.engine_id is not None:
                loads[choice.engine_id] += 1  # the next request of this submission sees it
                block_size = next(s.block_size for s in live if s.engine_id == choice.engine_id)
                if members:
                    self.recent.record(choice.engine_id, members[i].get(block_size, []))
            choices.append(choice)
        streams = [self._stream(c) for c in choices]
        return RoutePlan(streams, choices, depth + sum(routed_lengths))

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
            hashes = prefix_block_hashes(
                tokens, block_size, max_hit_blocks(len(tokens), block_size)
            )
            members[block_size] = [summary_member(h) for h in hashes]
        return members

    def _leading_hits(self, engine_id: str, members: list[bytes], held: list) -> int:
        """Blocks at the start of the prompt that the engine holds or was just sent."""
        now = time.monotonic()
        for i, member in enumerate(members):
            if not held[i] and not self.recent.was_sent(engine_id, member, now):
                return i
        return len(members)

    def _stream(self, choice: Choice) -> str:
        if choice.engine_id is None:
            return self.keys.requests
        return self.keys.routed_requests(choice.engine_id)
