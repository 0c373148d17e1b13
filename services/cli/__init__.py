"""The `pagedserve` command: one subcommand per module of this package.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func` (a callable taking the parsed arguments and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `--help` lists them.
SUBCOMMANDS: tuple[str, ...] = ("serve", "queue", "generate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedserve",
        description="LLM serving with PagedAttention and continuous batching.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"pagedserve.services.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
