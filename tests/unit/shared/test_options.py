"""The one option table: every parser, every `PAGEDSERVE_*` variable and every child command
line come from `shared/options.py`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pagedserve.services.cli import build_parser
from pagedserve.services.cli.launch_plan import Ports, ServeOptions, plan_launch
from pagedserve.services.gateway.__main__ import GATEWAY_OPTIONS
from pagedserve.services.gpu_worker.__main__ import build_parser as worker_parser
from pagedserve.services.scheduler.__main__ import build_parser as scheduler_parser
from pagedserve.shared.options import (
    CPU_SWITCHES,
    OPTIONS,
    Option,
    add_options,
    option_argv,
    optional_int,
    switch_on,
    use,
)

GENERATE_OWN_FLAGS = {"--prompts", "--output", "--max-tokens", "--temperature", "--top-p",
                      "--seed", "--ignore-eos", "--help"}  # fmt: skip
TABLE_FLAGS = {o.flag for o in OPTIONS.values()} | {a for o in OPTIONS.values() for a in o.aliases}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {f for action in parser._actions for f in action.option_strings} - {"-h", "--help"}


def subcommand(name: str) -> argparse.ArgumentParser:
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return subparsers.choices[name]


def gateway_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_options(parser, *GATEWAY_OPTIONS)
    return parser


@pytest.mark.parametrize(
    ("name", "parser"),
    [("scheduler", scheduler_parser), ("worker", worker_parser), ("gateway", gateway_parser),
     ("serve", lambda: subcommand("serve"))],
)  # fmt: skip
def test_every_service_flag_is_declared_in_the_table(name, parser) -> None:
    assert flags_of(parser()) - TABLE_FLAGS == set(), name


def test_generate_takes_the_engine_flags_from_the_table() -> None:
    assert flags_of(subcommand("generate")) - GENERATE_OWN_FLAGS - TABLE_FLAGS == set()


def test_every_flag_reads_its_variable_and_an_empty_one_is_unset(monkeypatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("PAGEDSERVE_BLOCK_SIZE", "")
    monkeypatch.setenv("PAGEDSERVE_NO_PREFIX_CACHING", "yes")
    args = scheduler_parser().parse_args([])
    assert (args.max_num_seqs, args.block_size, args.no_prefix_caching) == (7, None, True)
    assert scheduler_parser().parse_args(["--max-num-seqs", "9"]).max_num_seqs == 9


def test_a_false_variable_turns_a_default_on_switch_off(monkeypatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_ENABLE_PREFIX_CACHING", "0")
    args = build_parser().parse_args(["serve"])
    assert args.enable_prefix_caching is False


def test_a_new_flag_is_one_table_line(monkeypatch) -> None:
    option = Option("--step-timeout", 60.0, float, help="seconds one step may take")
    monkeypatch.setitem(OPTIONS, option.dest, option)
    monkeypatch.setenv("PAGEDSERVE_STEP_TIMEOUT", "90")
    parser = argparse.ArgumentParser()
    add_options(parser, "step_timeout")
    assert parser.parse_args([]).step_timeout == 90.0
    assert option_argv({"step_timeout": 12.5}) == ["--step-timeout", "12.5"]


def test_child_command_lines_leave_out_none_and_unset_switches() -> None:
    assert option_argv({"block_size": None, "no_prefix_caching": False, "rank": 1}) == [
        "--rank", "1"
    ]  # fmt: skip
    assert option_argv({"no_prefix_caching": True}) == ["--no-prefix-caching"]


def test_every_serve_child_command_line_parses_back_to_its_values() -> None:
    options = ServeOptions(tensor_parallel_size=2, max_model_len=512, block_size=32,
                           enable_prefix_caching=False, scheduling_policy="priority")  # fmt: skip
    plan = plan_launch(options, "/m", "redis://127.0.0.1:1/0", Ports(1, 2, 3, 4), "/tmp/s")
    scheduler = scheduler_parser().parse_args(plan.engine[0].argv[4:])
    assert (scheduler.max_model_len, scheduler.block_size, scheduler.policy) == (
        512,
        32,
        "priority",
    )
    assert scheduler.no_prefix_caching and scheduler.plan_address == "ipc:///tmp/s/plan.sock"
    worker = worker_parser().parse_args(plan.engine[2].argv[4:])
    assert (worker.rank, worker.block_size, worker.result_address) == (
        1, 32, "ipc:///tmp/s/result.sock"
    )  # fmt: skip


def test_use_adjusts_one_parser_without_touching_the_table() -> None:
    adjusted = use("max_num_seqs", default=64)
    assert adjusted.default == 64 and OPTIONS["max_num_seqs"].default == 256
    assert adjusted.env_names == ("PAGEDSERVE_MAX_NUM_SEQS",)


@pytest.mark.parametrize(("text", "value"), [("", None), ("none", None), ("None", None), ("8", 8)])
def test_optional_int(text: str, value: int | None) -> None:
    assert optional_int(text) == value


def test_every_cpu_switch_read_anywhere_is_declared_in_the_table() -> None:
    """Every `PAGEDSERVE_CPU_*` name in the product is one of `CPU_SWITCHES`, and each of
    those is read somewhere (no stale entry)."""
    checkout = Path(__file__).resolve().parents[3]
    named = set()
    for folder in ("services", "shared", "kernels"):
        for path in (checkout / folder).rglob("*.py"):
            if path.name != "options.py":
                named |= set(re.findall(r"PAGEDSERVE_CPU_[A-Z0-9_]+", path.read_text()))
    assert named == set(CPU_SWITCHES)


def test_a_cpu_switch_is_on_unless_turned_off(monkeypatch) -> None:
    monkeypatch.delenv("PAGEDSERVE_CPU_NORM_KERNEL", raising=False)
    assert switch_on("PAGEDSERVE_CPU_NORM_KERNEL")
    for off in ("0", "false", "No", "off"):
        monkeypatch.setenv("PAGEDSERVE_CPU_NORM_KERNEL", off)
        assert not switch_on("PAGEDSERVE_CPU_NORM_KERNEL")
    monkeypatch.setenv("PAGEDSERVE_CPU_NORM_KERNEL", "1")
    assert switch_on("PAGEDSERVE_CPU_NORM_KERNEL")
