"""When `pagedserve serve` restarts a dead child, and when it gives up.

Each death of a child (by name) is remembered for `window_s`. A death is answered with a
restart after a backoff that doubles with each recent death of that child (`base_delay_s`,
2x, 4x, ... capped at `max_delay_s`), so a child that dies at once on start does not spin; the
`max_deaths`-th death within the window is a crash loop: serve stops everything and exits 1,
because restarting again would only hide a fault that needs a person (a bad flag, a full
disk, a model that no longer loads).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

DEFAULT_MAX_DEATHS = 5
DEFAULT_WINDOW_S = 60.0


class CrashLoopError(RuntimeError):
    """A child died `max_deaths` times within `window_s`: serve stops everything."""


@dataclass
class RestartPolicy:
    max_deaths: int = DEFAULT_MAX_DEATHS
    window_s: float = DEFAULT_WINDOW_S
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    _deaths: defaultdict[str, deque[float]] = field(
        default_factory=lambda: defaultdict(deque), repr=False
    )

    def __post_init__(self) -> None:
        if self.max_deaths < 1:
            raise ValueError(f"max_deaths must be >= 1, got {self.max_deaths}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")

    def num_recent_deaths(self, name: str, now: float) -> int:
        deaths = self._deaths[name]
        while deaths and now - deaths[0] > self.window_s:
            deaths.popleft()
        return len(deaths)

    def on_death(self, name: str, now: float) -> float:
        """Seconds to wait before restarting `name`; CrashLoopError when it must not be."""
        self._deaths[name].append(now)
        num_deaths = self.num_recent_deaths(name, now)
        if num_deaths >= self.max_deaths:
            raise CrashLoopError(
                f"{name} died {num_deaths} times within {self.window_s:g} s: a crash loop, "
                "not restarting it again"
            )
        return min(self.base_delay_s * 2 ** (num_deaths - 1), self.max_delay_s)
