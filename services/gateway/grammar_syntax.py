"""Which syntax a grammar is written in: EBNF/GBNF (`root ::= ...`) or Lark (`start: ...`).

vLLM takes both in one field (`structured_outputs.grammar`, `guided_grammar`) and tells them
apart by their rule syntax, as here: a GBNF rule is `name ::= ...` with `root` as its root, a
Lark rule or terminal is `name: ...` (or `?name:`, `NAME.2:`) with `start` as its root, and
only Lark has `%import` / `%ignore` directives. Each comment style is dropped first (`#` in
GBNF, `//` in Lark), so a comment cannot decide."""

from __future__ import annotations

import re

_LARK_DEFINITION = re.compile(r"^\s*[?!]?[A-Za-z_][A-Za-z0-9_]*(\.-?\d+)?\s*(\{[^}]*\})?\s*:")
_LARK_DIRECTIVE = re.compile(r"^\s*%[a-z]+\b")
_COMMENT = re.compile(r"(^|\s)(//|#).*$")


def _code_lines(grammar: str) -> list[str]:
    lines = (_COMMENT.sub("", line) for line in grammar.splitlines())
    return [line for line in lines if line.strip()]


def is_lark(grammar: str) -> bool:
    """True for a Lark grammar; False for EBNF/GBNF (the default when neither is clear, so
    that the EBNF parser names what is wrong)."""
    lines = _code_lines(grammar)
    if any("::=" in line for line in lines):
        return False
    return any(_LARK_DEFINITION.match(line) or _LARK_DIRECTIVE.match(line) for line in lines)
