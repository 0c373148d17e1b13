"""Fixtures of the reliability suite: the pipeline fixtures (tiny served model, in-process
reference engine, pipeline factory that stops every process) and the failure-report hook."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.pipeline.conftest import (  # noqa: F401  (fixtures and hook)
    pipeline_factory,
    pytest_runtest_makereport,
    reference_engine,
    served_model_dir,
)
from tests.integration.reliability.cpu_burner import cpu_burners


@pytest.fixture
def burning_cpus() -> Iterator[list[subprocess.Popen]]:
    """Two processes spinning on the CPU for the length of the test (at most 10 minutes)."""
    with cpu_burners(num=2, duration_s=600) as burners:
        yield burners
