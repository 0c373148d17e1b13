"""The compose tests build images and start containers for many minutes: they run only when
asked for by marker (`pytest -m compose tests/compose`, or `make test-compose`), never as part
of a plain `pytest`. Every phase's time is printed at the end of the session."""

from __future__ import annotations

import pytest

from tests.compose.deployment import FINDINGS, PHASES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "compose" in (config.getoption("markexpr") or ""):
        return
    skipped = [item for item in items if item.get_closest_marker("compose")]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if not item.get_closest_marker("compose")]


def pytest_terminal_summary(terminalreporter) -> None:
    if not PHASES:
        return
    terminalreporter.section("compose phase timings")
    for name, seconds in PHASES.items():
        terminalreporter.write_line(f"{name:<40} {seconds:8.1f} s")
    terminalreporter.write_line(f"{'total':<40} {sum(PHASES.values()):8.1f} s")
    for line in FINDINGS:
        terminalreporter.write_line(line)
