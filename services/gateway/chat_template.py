"""The chat template a gateway renders prompts with: the model's own, or vLLM's
`--chat-template` (a file, or the template text itself), and whether it renders `tools` (what
tool_choice "auto" needs: the model must be told, in its own format, which tools it has)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_JINJA_MARKS = ("{{", "{%")
_TOOLS_NAME = re.compile(r"\btools\b")


def load_chat_template(value: str) -> str:
    """The template text of a `--chat-template` value; ValueError when it is neither a
    readable file nor template text, or does not parse as Jinja."""
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    elif any(mark in value for mark in _JINJA_MARKS):
        text = value
    else:
        raise ValueError(
            f"--chat-template {value!r} is neither a readable file nor a Jinja template"
        )
    _parse(text)
    return text


def _parse(template: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return environment.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(
            f"the chat template is not valid Jinja (line {exc.lineno}): {exc}"
        ) from exc


def renders_tools(template: str | None) -> bool:
    """Whether the template reads the `tools` variable."""
    if not template:
        return False
    import jinja2.meta

    try:
        return "tools" in jinja2.meta.find_undeclared_variables(_parse(template))
    except ValueError:  # a model's template with tags of transformers' own: look at the text
        return bool(_TOOLS_NAME.search(template))
