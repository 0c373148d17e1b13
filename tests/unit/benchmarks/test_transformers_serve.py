"""The `transformers serve` baseline: the flags it is started with (checked against the
installed transformers' own CLI), the request body it accepts, and a run of the benchmark
client against a server that, like it, ends streams without `data: [DONE]`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.transformers_serve import (
    TransformersServeConfig,
    TransformersServeEndpoint,
    transformers_serve_argv,
    transformers_serve_env,
)
from pagedserve.services.cli.loadgen.runner import LoadConfig, run_load
from pagedserve.services.cli.loadgen.workload import BenchRequest
from tests.unit.benchmarks.fake_openai_server import fake_openai_server

CONFIG = TransformersServeConfig(Path("/models/smol"), threads=2)
REPO_ROOT = Path(__file__).resolve().parents[3]
REQUEST = BenchRequest(" the cat sat", [2, 3, 4], output_len=5)


def test_the_body_asks_for_greedy_exact_lengths_without_fields_it_would_reject() -> None:
    body = TransformersServeEndpoint("http://h:1", "/models/smol").body(REQUEST)
    assert json.loads(body["generation_config"]) == {"do_sample": False, "eos_token_id": -1}
    assert body["max_tokens"] == 5 and body["temperature"] == 0.0 and body["stream"] is True
    assert body["model"] == "/models/smol" and body["prompt"] == " the cat sat"
    # unknown fields are a 422 there; stream_options is ignored with a warning
    assert not {"ignore_eos", "min_tokens", "stream_options"} & body.keys()


def test_argv_carries_the_issue_flags_and_a_port() -> None:
    argv = transformers_serve_argv(CONFIG, 8123)
    text = " ".join(argv)
    assert argv[:5] == [sys.executable, "-P", "-m", "transformers.cli.transformers", "serve"]
    assert argv[5] == "/models/smol"
    for flags in ("--continuous-batching", "--device cpu", "--dtype float32",
                  "--cb-block-size 32", "--cb-num-blocks 1536", "--cb-max-batch-tokens 512",
                  "--host 127.0.0.1", "--port 8123"):  # fmt: skip
        assert flags in text


def test_env_is_offline_keeps_isa_caps_and_sets_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    env = transformers_serve_env(CONFIG)
    assert env["HF_HUB_OFFLINE"] == "1" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["OMP_NUM_THREADS"] == "2"
    no_threads = TransformersServeConfig(Path("/m"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in transformers_serve_env(no_threads)


def test_every_flag_exists_in_the_installed_transformers_cli() -> None:
    """`serve --help` of the transformers we run lists each flag we pass (a renamed flag
    would otherwise only show when the suite starts the server)."""
    pytest.importorskip("fastapi", reason="transformers serve needs fastapi (dev extras)")
    argv = transformers_serve_argv(CONFIG, 8123)
    help_text = subprocess.run(
        [*argv[:5], "--help"], capture_output=True, text=True, timeout=120,
        env={**transformers_serve_env(CONFIG), "COLUMNS": "200"},
    ).stdout  # fmt: skip
    for flag in (a for a in argv[6:] if a.startswith("--")):
        assert flag in help_text, f"{flag} is not a `transformers serve` flag"


def test_the_checkouts_kernels_folder_does_not_shadow_hugging_faces_kernels() -> None:
    """Started from the repository root (as the suite is), the server's interpreter must not
    find our `kernels/` folder as a top-level `kernels`: transformers' serve imports Hugging
    Face's package of that name and exited at start-up (ImportError: CUDAProperties)."""
    argv = transformers_serve_argv(CONFIG, 8123)
    interpreter = argv[: argv.index("-m")]
    find = "import importlib.util as u; s = u.find_spec('kernels'); print(s and s.origin)"
    origin = subprocess.run(
        [*interpreter, "-c", find], capture_output=True, text=True, timeout=60, check=True,
        cwd=REPO_ROOT,
    ).stdout.strip()  # fmt: skip
    assert not origin.startswith(str(REPO_ROOT / "kernels")), origin


def test_a_stream_without_done_is_read_to_its_end_with_every_token() -> None:
    requests = [REQUEST, BenchRequest(" the dog", [2, 9], output_len=3)]
    with fake_openai_server(send_done=False) as server:
        endpoint = TransformersServeEndpoint(server.base_url, "m")
        summary = asyncio.run(run_load(endpoint, requests, LoadConfig(max_concurrency=2)))
    assert summary["num_completed"] == 2 and summary["num_wrong_length"] == 0
    assert summary["total_output_tokens"] == 8
    assert all("generation_config" in body for body in server.bodies)
