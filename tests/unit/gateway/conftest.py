from __future__ import annotations

import pytest

from pagedserve.services.gateway.tokenizer import TokenizerInfo
from tests.unit.gateway.helpers import load_test_tokenizer


@pytest.fixture(scope="session")
def info() -> TokenizerInfo:
    return load_test_tokenizer()
