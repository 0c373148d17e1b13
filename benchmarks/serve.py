"""`python -m benchmarks.serve ARGS` = `pagedserve bench ARGS` (what `perf_suite.sh` runs).

The load generator itself is part of the product (`services/cli/loadgen/`): benchmarks import
the product, never the reverse."""

from __future__ import annotations

import sys

from pagedserve.services.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
