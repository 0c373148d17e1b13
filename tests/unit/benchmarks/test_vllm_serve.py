"""The vLLM peer: the command and environment it is started with, its thread binding, and
the report of a comparison built from canned results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.report_writer import build_report
from benchmarks.vllm_serve import VllmServeConfig, omp_bind, vllm_serve_argv, vllm_serve_env
from benchmarks.vs_vllm import build_parser
from benchmarks.vs_vllm_report import report

CONFIG = VllmServeConfig(Path("/venv/bin/python"), Path("/models/smol"), "float32", threads=1)


def test_it_runs_vllms_openai_server_from_its_own_venv() -> None:
    argv = vllm_serve_argv(CONFIG, 8123)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/models/smol"
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--port") + 1] == "8123"


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


def _level(rate, tok_s, kept) -> dict:
    return {"max_concurrency": None if rate else 16, "request_rate": rate, "output_tok_s": tok_s,
            "ttft_p50_ms": 100.0, "ttft_p99_ms": 300.0, "tpot_p50_ms": 40.0, "tpot_p99_ms": 60.0,
            "rounds_kept": kept, "rounds_thrown_out": []}  # fmt: skip


def canned_result() -> dict:
    return {
        "machine": {"cpu": "AMD EPYC", "num_cpus": 2, "isa_flags": ["avx2"],
                    "lscpu_isa_flags": ["avx2", "fma"], "isa_env": {},
                    "torch_cpu_capability": "AVX2", "loadavg": [0.5, 0.6, 0.7]},
        "workload": {"num_requests": 48, "total_output_tokens": 4000},
        "dtype": "float32", "threads": 2, "max_steal": 0.1, "command": "python -m x",
        "peer": {"vllm": "0.32.0", "torch": "2.9", "torch_cpu_capability": "AVX2",
                 "dtype": "float32", "omp_bind": "0-1", "kv_cache_gib": 3},
        "rounds": {"pagedserve": [{"steal_share": 0.01}, {"steal_share": 0.2}],
                   "vLLM CPU": [{"steal_share": 0.0}, {"steal_share": None}]},
        "medians": {"pagedserve": [_level(None, 300.0, [1, 2]), _level(1.0, 60.0, [1])],
                    "vLLM CPU": [_level(None, 200.0, [1, 2]), _level(1.0, None, [])]},
    }  # fmt: skip


def test_the_report_shows_both_servers_the_peer_and_every_rounds_steal() -> None:
    text = report(canned_result())
    assert "| 16 in flight | 300.0 | 200.0 | 1.50x | 100 / 100 | 300 / 300 | 40 / 40 |" in text
    assert "| 1 req/s | 60.0 | - | - |" in text and text.count("| 1 / 0 |") == 1
    assert "vLLM 0.32.0 CPU build" in text and "bound to 0-1" in text
    assert "pagedserve: 1.0%, 20.0%; vLLM CPU: 0.0%, -" in text
    assert "lscpu flags of note: avx2, fma" in text and "Command: `python -m x`" in text


def test_the_report_is_a_section_of_the_performance_summary(tmp_path: Path) -> None:
    (tmp_path / "vs_vllm.json").write_text(json.dumps(canned_result()))
    summary = build_report(tmp_path)
    assert summary.startswith("## pagedserve vs vLLM's CPU build")
    assert "| 16 in flight | 300.0 | 200.0 | 1.50x |" in summary
