"""One log format for every process: time, service, level, message."""

from __future__ import annotations

import logging
import os
import sys


def setup_logging(service: str, level: str | None = None) -> logging.Logger:
    level = level or os.environ.get("PAGEDSERVE_LOG_LEVEL", "INFO")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return logging.getLogger(service)
