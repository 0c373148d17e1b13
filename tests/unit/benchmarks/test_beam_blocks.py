from __future__ import annotations

import json

from benchmarks import beam_blocks


def test_beam_blocks_counts_shared_blocks_on_a_tiny_model(tmp_path):
    out = tmp_path / "beam_blocks.json"
    beam_blocks.main(["--model", beam_blocks.TINY, "--num-prompts", "2", "--max-tokens", "6",
                      "--widths", "3", "--num-blocks", "256", "--out", str(out)])  # fmt: skip
    runs = {r["mode"]: r for r in json.loads(out.read_text())["runs"]}
    for run in runs.values():
        assert run["held_block_steps"] <= run["unshared_block_steps"]
        assert run["peak_held"] <= run["peak_unshared"]
    assert runs["beam"]["saving"] > 0  # beams share at least their prompt's blocks
    assert runs["parallel"]["saving"] > 0  # so do the samples of one prompt
