"""The kinds of request field: each one both reads its value from a body (a 400 naming the
field and the bound it broke, like TGI's "`top_p` must be > 0.0 and <= 1.0") and states
itself as an OpenAPI schema, so that the validator and /openapi.json cannot disagree.

The fields themselves, with their bounds, are listed once in `field_table.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.shared.request_bounds import INT32_MAX
from pagedserve.shared.value_checks import is_finite_number, is_int

_ABSENT = object()  # "use the field's own default"


def kind_of(value: Any) -> str:
    """A value's JSON kind, for error messages."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    kinds = {str: "string", int: "integer", float: "number", list: "array", dict: "object"}
    return kinds.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class Field:
    """One request field: `read` its value (or the default when absent or null) and state
    its `schema`."""

    name: str

    def read(self, body: dict[str, Any], default: Any = _ABSENT) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class BoolField(Field):
    default: bool | None = False

    def read(self, body: dict[str, Any], default: Any = _ABSENT) -> Any:
        value = body.get(self.name)
        if value is None:
            return self.default if default is _ABSENT else default
        if not isinstance(value, bool):
            raise bad_request(f"`{self.name}` must be a boolean, got {kind_of(value)}", self.name)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean", "nullable": True}


@dataclass(frozen=True)
class IntField(Field):
    low: int = 0
    high: int = INT32_MAX
    default: int | None = None

    def read(self, body: dict[str, Any], default: Any = _ABSENT) -> Any:
        value = body.get(self.name)
        if value is None:
            return self.default if default is _ABSENT else default
        if not is_int(value):
            raise bad_request(f"`{self.name}` must be an integer, got {kind_of(value)}", self.name)
        if not self.low <= value <= self.high:
            raise bad_request(
                f"`{self.name}` must be >= {self.low} and <= {self.high}, got {value}", self.name
            )
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high, "nullable": True}


@dataclass(frozen=True)
class NumberField(Field):
    low: float = 0.0
    high: float = 1.0
    default: float = 0.0
    low_open: bool = False  # (low, high] instead of [low, high]

    def read(self, body: dict[str, Any], default: Any = _ABSENT) -> Any:
        value = body.get(self.name)
        if value is None:
            return self.default if default is _ABSENT else default
        if not is_finite_number(value):
            raise bad_request(
                f"`{self.name}` must be a finite number, got {kind_of(value)}", self.name
            )
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or value > self.high:
            sign = ">" if self.low_open else ">="
            raise bad_request(
                f"`{self.name}` must be {sign} {self.low} and <= {self.high}, got {value}",
                self.name,
            )
        return float(value)

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "number", "minimum": self.low, "maximum": self.high}
        if self.low_open:
            schema["exclusiveMinimum"] = True
        return {**schema, "nullable": True}


@dataclass(frozen=True)
class StringField(Field):
    def read(self, body: dict[str, Any], default: Any = _ABSENT) -> Any:
        value = body.get(self.name)
        if value is None:
            return None if default is _ABSENT else default
        if not isinstance(value, str):
            raise bad_request(f"`{self.name}` must be a string, got {kind_of(value)}", self.name)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "nullable": True}


@dataclass(frozen=True)
class CustomField(Field):
    """A field whose shape needs its own reader (prompts, messages, stop strings, ...): the
    reader and the schema are written side by side in the table."""

    reader: Callable[[dict[str, Any]], Any] = field(default=lambda body: None)
    json_schema: dict[str, Any] = field(default_factory=dict)

    def read(self, body: dict[str, Any], default: Any = _ABSENT) -> Any:
        return self.reader(body)

    def schema(self) -> dict[str, Any]:
        return self.json_schema


def properties(fields: tuple[Field, ...]) -> dict[str, Any]:
    """The OpenAPI `properties` of a request made of `fields`."""
    return {f.name: f.schema() for f in fields}
