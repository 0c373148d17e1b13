"""benchmarks/level_split.py: what a step carried, the split by bucket, and one small level."""

from __future__ import annotations

import json

import pytest

from benchmarks import level_split
from benchmarks.bench_args import add_workload_args, workload_args
from pagedserve.services.cli.loadgen.runner import build_workload
from pagedserve.shared.protocol import CachedSequence, NewSequence, SamplingParams, StepPlan


def _new(seq_id: str, scheduled: int) -> NewSequence:
    return NewSequence(seq_id, list(range(100)), 100, 0, scheduled, [0], SamplingParams())


def _cached(seq_id: str, scheduled: int, drafts: int = 0) -> CachedSequence:
    return CachedSequence(seq_id, [1], [], 50, scheduled, draft_token_ids=[7] * drafts)


def test_a_step_counts_prompt_chunks_apart_from_decodes_and_their_drafts():
    plan = StepPlan(
        step_id=3,
        new_seqs=[_new("a", 40)],
        cached_seqs=[_cached("b", 30), _cached("c", 4, drafts=3), _cached("d", 1)],
    )
    record = level_split.step_record(plan, seconds=0.5, output_tokens=5)
    assert (record.num_seqs, record.prompt_tokens, record.draft_tokens) == (4, 70, 3)
    decode_only = level_split.step_record(
        StepPlan(step_id=4, cached_seqs=[_cached("c", 4, drafts=3), _cached("d", 1)]), 0.1, 3
    )
    assert decode_only.prompt_tokens == 0 and decode_only.draft_tokens == 3


def test_the_split_adds_up_by_bucket_in_order():
    records = [
        level_split.StepRecord(0.6, 64, 450, 0, 60),
        level_split.StepRecord(0.2, 64, 0, 0, 64),
        level_split.StepRecord(0.2, 70, 0, 0, 70),
        level_split.StepRecord(0.05, 2, 0, 6, 5),
    ]
    table = level_split.split(records, wall_s=2.0)
    assert list(table) == ["decode, 1+ seqs", "decode, 64+ seqs", "prompt, 64+ seqs"]
    decodes = table["decode, 64+ seqs"]
    assert decodes["steps"] == 2 and decodes["output_tokens"] == 134
    assert decodes["share_of_wall"] == pytest.approx(0.2)
    assert decodes["ms_per_step"] == pytest.approx(200.0)
    assert table["prompt, 64+ seqs"]["prompt_tokens"] == 450


def test_the_recorder_keeps_the_last_plan_and_gives_the_scheduler_back():
    class Scheduler:
        def schedule(self, plan_ahead: bool = False) -> tuple[str, bool]:
            return ("plan", plan_ahead)

    scheduler = Scheduler()
    with level_split.PlanRecorder(scheduler) as recorder:
        assert scheduler.schedule(plan_ahead=True) == ("plan", True)
        assert recorder.plan == ("plan", True)
    assert "schedule" not in vars(scheduler)  # the class's method again
    assert scheduler.schedule() == ("plan", False) and recorder.plan == ("plan", True)


def test_no_one_in_flight_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        level_split.main(["--concurrency", "0"])
    assert "--concurrency must be at least 1, got 0" in capsys.readouterr().err


def test_a_small_level_runs_every_request_with_at_most_so_many_in_flight(tmp_path, capsys):
    flags = ["--num-prompts", "6", "--prompt-len", "12", "--prompt-len-range", "4,40",
             "--output-len", "5", "--output-len-range", "2,12"]  # fmt: skip
    out = tmp_path / "split.json"
    level_split.main(
        [*flags, "--concurrency", "2", "--threads", "1", "--dtype", "float32", "--out", str(out)]
    )
    parser = level_split.argparse.ArgumentParser()
    add_workload_args(parser.add_argument)
    requests = build_workload(workload_args(parser.parse_args(flags)))[0]
    result = json.loads(out.read_text())
    assert result["output_tokens"] == sum(r.output_len for r in requests)
    steps = result["steps"]
    assert max(s["num_seqs"] for s in steps) == 2
    assert 0 < sum(s["prompt_tokens"] for s in steps) <= sum(r.prompt_len for r in requests)
    assert sum(row["steps"] for row in result["split"].values()) == len(steps)
    assert "| steps carrying |" in capsys.readouterr().out
