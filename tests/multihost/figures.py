"""What the multihost scenarios measured, by scenario, for the session's summary."""

from __future__ import annotations

FIGURES: dict[str, dict[str, object]] = {}
