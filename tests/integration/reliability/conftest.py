"""Fixtures of the reliability suite: the pipeline fixtures (tiny served model, in-process
reference engine, pipeline factory that stops every process) and the failure-report hook."""

from __future__ import annotations

from tests.integration.pipeline.conftest import (  # noqa: F401  (fixtures and hook)
    pipeline_factory,
    pytest_runtest_makereport,
    reference_engine,
    served_model_dir,
)
