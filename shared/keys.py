"""Redis key names, in one place. Every key lives under a namespace so that several
deployments can share one Redis server."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.shared.config import DEFAULT_NAMESPACE

ENGINE_GROUP = "engines"  # the consumer group that engines read the request stream through


@dataclass(frozen=True)
class RedisKeys:
    namespace: str = DEFAULT_NAMESPACE

    @property
    def requests(self) -> str:
        """Stream of GenerateRequest entries (field `m`), read by engines via ENGINE_GROUP."""
        return f"{self.namespace}:requests"

    def routed_requests(self, engine_id: str) -> str:
        """Stream of GenerateRequest entries routed to one engine by a gateway (field `m`),
        read through ENGINE_GROUP like `requests`: by that engine, or by any live engine once
        that engine is dead."""
        return f"{self.namespace}:requests:{engine_id}"

    def cache_summary(self, engine_id: str) -> str:
        """Set of one engine's cached block digests, truncated (shared/cache_summary.py)."""
        return f"{self.namespace}:cache:{engine_id}"

    @property
    def aborts(self) -> str:
        """Stream of AbortRequest entries (field `m`), read by every engine (no group)."""
        return f"{self.namespace}:aborts"

    @property
    def engines(self) -> str:
        """Set of engine ids that have registered."""
        return f"{self.namespace}:engines"

    @property
    def gateways(self) -> str:
        """Set of gateway ids that have registered."""
        return f"{self.namespace}:gateways"

    def output(self, gateway_id: str) -> str:
        """Stream of OutputBatch entries (field `m`) for one gateway replica."""
        return f"{self.namespace}:out:{gateway_id}"

    def engine(self, engine_id: str) -> str:
        """Hash of one engine's live stats and heartbeat time."""
        return f"{self.namespace}:engine:{engine_id}"

    def gateway(self, gateway_id: str) -> str:
        """Heartbeat key of one gateway replica, with a TTL: gone means the gateway is dead."""
        return f"{self.namespace}:gateway:{gateway_id}"

    def request(self, request_id: str) -> str:
        """Hash of one request's state and timeline, kept for a while after it finishes."""
        return f"{self.namespace}:req:{request_id}"

    @property
    def process_restarts(self) -> str:
        """Hash: process name -> how often `pagedserve serve` restarted it (read by /metrics)."""
        return f"{self.namespace}:serve:restarts"
