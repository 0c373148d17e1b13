"""The multihost tests build network-namespace hosts (root) and run the whole system on them for
minutes: they run only when asked for by marker (`pytest -m multihost tests/multihost`, or
`make test-multihost`), never as part of a plain `pytest`. The figures they measure are printed
at the end of the session (docs/RELIABILITY.md quotes them)."""

from __future__ import annotations

import pytest

from tests.multihost.figures import FIGURES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "multihost" in (config.getoption("markexpr") or ""):
        return
    deselected = [item for item in items if item.get_closest_marker("multihost")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("multihost")]


def pytest_terminal_summary(terminalreporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("multihost figures")
    for scenario, figures in FIGURES.items():
        line = ", ".join(f"{k} {v}" for k, v in figures.items())
        terminalreporter.write_line(f"{scenario}: {line}")
