"""Benchmarks: run from the checkout as `python -m benchmarks.NAME`; not shipped in the wheel."""

import sys as _sys
from pathlib import Path as _Path

# `python -m benchmarks.x` puts the checkout first on sys.path, where its kernels/ folder would
# stand in front of Hugging Face's `kernels` distribution (which transformers imports). Our code
# is imported as `pagedserve.*`; the checkout moves to the end, where it still finds benchmarks.
_CHECKOUT = str(_Path(__file__).resolve().parent.parent)
_sys.path[:] = [p for p in _sys.path if str(_Path(p or ".").resolve()) != _CHECKOUT] + [_CHECKOUT]
