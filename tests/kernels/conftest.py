"""Shared by the CPU kernel tests."""

from __future__ import annotations

import pytest

from pagedserve.kernels import cpu_small_sgemm


@pytest.fixture
def fresh_sgemm_load():
    """The float32 GEMM library loaded anew for the test (a test may change the capability
    it is built for, or turn it off), and again after it."""
    cpu_small_sgemm.load.cache_clear()
    cpu_small_sgemm._panel_columns.cache_clear()
    yield
    cpu_small_sgemm.load.cache_clear()
    cpu_small_sgemm._panel_columns.cache_clear()
