"""How long no engine has been seen live, counted only while the gateway could see.

The gateway learns that engines are alive from their status records in Redis. When Redis is
unreachable or stalled, the gateway is blind: that says nothing about the engines, which keep
running (and are just as blind). So the engine-loss clock only advances between two
successful, prompt reads of the status records that both found no live engine; a failed or
slow read stops it until the next good one. A Redis outage of any length followed by recovery
therefore costs an open stream nothing; an engine seen dead for `engine_loss_timeout_s` while
Redis answers does end the open streams (see `EngineClient._watch_engines`).
"""

from __future__ import annotations

from dataclasses import dataclass

SLOW_READ_S = 1.0  # a status read slower than this means Redis was stalled: treat as blind


@dataclass(slots=True)
class EngineLossClock:
    """Seconds of readable time with no live engine."""

    num_dead_s: float = 0.0
    _last_dead_read_at: float | None = None  # end of the previous good read that saw none

    def saw_live(self) -> None:
        self.num_dead_s = 0.0
        self._last_dead_read_at = None

    def was_blind(self) -> None:
        """The read failed or was too slow: this stretch of time counts for nothing."""
        self._last_dead_read_at = None

    def saw_none_live(self, now: float) -> None:
        if self._last_dead_read_at is not None:
            self.num_dead_s += now - self._last_dead_read_at
        self._last_dead_read_at = now

    def record_read(self, started_at: float, now: float, any_live: bool | None) -> None:
        """One read of the status records from `started_at` to `now`; `any_live` None: it
        failed."""
        if any_live is None or now - started_at > SLOW_READ_S:
            self.was_blind()
        elif any_live:
            self.saw_live()
        else:
            self.saw_none_live(now)
