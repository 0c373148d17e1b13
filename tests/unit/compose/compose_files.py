"""Loading compose/ the way `docker compose` does: .env defaults, `${VAR:-default}`
interpolation, YAML merge keys, then validation against the compose spec (`compose-spec`)."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import compose_spec

COMPOSE_DIR = Path(__file__).resolve().parents[3] / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def read_env_file(path: Path = COMPOSE_DIR / ".env") -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: `$$`, `${VAR}`, `${VAR-default}`, `${VAR:-default}`."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, default = match.groups()
        value = env.get(name)
        if operator == ":-" and not value:
            return default
        if operator == "-" and value is None:
            return default
        return value or ""

    return _VARIABLE.sub(substitute, text)


def load_compose(overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as `docker compose config` would see it; raises ValueError when the
    file breaks the compose spec."""
    env = read_env_file() | (overrides or {})
    text = interpolate(COMPOSE_FILE.read_text(), env)
    project = compose_spec.PyOptions(apply_merge=True).from_yaml(text)
    project.validate()
    project.to_spec()  # the typed pydantic model: catches wrong value types
    return project.to_dict()


def active_services(compose: dict[str, Any], profiles: set[str]) -> dict[str, dict[str, Any]]:
    """Services that `COMPOSE_PROFILES=<profiles>` starts: no profile, or a chosen one."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if not svc.get("profiles") or profiles & set(svc["profiles"])
    }


@contextlib.contextmanager
def environment(env: dict[str, str | None]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def parse_service_args(module: str, argv: list[str], env: dict[str, str | None]) -> Any:
    """`python -m <module> <argv>` parsed by that module's own argparse parser, under `env`
    (flags read `PAGEDSERVE_<FLAG>` defaults when the parser is built). An unknown flag or a bad
    value raises SystemExit, as it would in the container."""
    main = importlib.import_module(f"{module}.__main__" if _is_package(module) else module)
    with environment(env):
        if hasattr(main, "build_parser"):
            return main.build_parser().parse_args(argv)
        if hasattr(main, "parse_args"):
            return main.parse_args(argv)
    raise AssertionError(f"{module} has neither build_parser() nor parse_args(argv)")


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def python_module_command(command: list[str]) -> tuple[str, list[str]] | None:
    """(`module`, argv) for a `python -m module ...` command, else None."""
    if len(command) >= 3 and command[0] == "python" and command[1] == "-m":
        return command[2], command[3:]
    return None
