"""Type checks for values that come from outside (JSON bodies, msgpack entries, a model's
config.json), where a bool must not pass for an int."""

from __future__ import annotations

import math


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: object) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]
