"""The vLLM peer: the command and environment it is started with, its thread binding, and
where the comparison takes its interpreter from."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from benchmarks.vllm_serve import VllmServeConfig, omp_bind, vllm_serve_argv, vllm_serve_env
from benchmarks.vs_vllm import build_parser

CONFIG = VllmServeConfig(Path("/venv/bin/python"), Path("/models/smol"), "float32", threads=1)


def test_it_runs_vllms_openai_server_from_its_own_venv() -> None:
    argv = vllm_serve_argv(CONFIG, 8123)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/models/smol"
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--port") + 1] == "8123"


def test_ngram_speculation_is_asked_for_only_when_given() -> None:
    assert "--speculative-config" not in vllm_serve_argv(CONFIG, 8123)
    argv = vllm_serve_argv(dataclasses.replace(CONFIG, num_speculative_tokens=3), 8123)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3,
                    "prompt_lookup_max": 4, "prompt_lookup_min": 2}  # fmt: skip
    args = build_parser().parse_args([])
    assert args.num_speculative_tokens is None  # each server's own default
    assert build_parser().parse_args(["--num-speculative-tokens", "0"]).num_speculative_tokens == 0


def test_extra_flags_reach_its_command_line_and_its_report_line() -> None:
    from benchmarks.vs_vllm import vllm_config
    from benchmarks.vs_vllm_report import peer_line

    assert vllm_serve_argv(CONFIG, 8123)[-1] == "8123"  # none by default
    args = build_parser().parse_args(["--vllm-args", "--block-size 16"])
    args.vllm_python, args.dtype_resolved = "/venv/bin/python", "bfloat16"
    config = vllm_config(args, Path("/models/smol"))
    assert vllm_serve_argv(config, 8123)[-2:] == ["--block-size", "16"]
    peer = {"vllm": "0.32", "torch": "2.13", "torch_cpu_capability": "AVX512",
            "dtype": "bfloat16", "omp_bind": "0-1", "kv_cache_gib": 3}  # fmt: skip
    assert peer_line(peer).endswith("3 GiB KV cache.")
    assert peer_line(peer | {"extra_args": ["--block-size", "16"]}).endswith(
        "3 GiB KV cache, started with `--block-size 16`."
    )


def test_its_environment_names_the_cpu_backend_threads_and_kv_space(monkeypatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    env = vllm_serve_env(CONFIG)
    first = min(os.sched_getaffinity(0))
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == f"{first}-{first}"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["HF_HUB_OFFLINE"] == "1"


def test_threads_bind_to_the_first_cores_and_too_many_is_an_error() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert omp_bind(None).split("-")[0].split(",")[0] == str(cores[0])
    with pytest.raises(ValueError, match="threads must be between 1 and"):
        omp_bind(len(cores) + 1)


def test_the_peer_comes_from_the_flag_or_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    assert build_parser().parse_args([]).vllm_python is None
    monkeypatch.setenv("VLLM_PYTHON", "/v/bin/python")
    assert build_parser().parse_args([]).vllm_python == "/v/bin/python"
    assert build_parser().parse_args(["--vllm-python", "/w/python"]).vllm_python == "/w/python"
