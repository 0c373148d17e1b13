"""`pagedserve serve --device cuda` and `pagedserve bench` against it, with the HF `generate`
baseline on the same GPU in the same run, for `benchmarks.device_check`. HF runs after the
workload, while the server sits idle holding its KV cache (the default 90% of GPU memory
leaves ample room for a small model). Writes serve.log, serve_bench.json and the bench's
output.

    python -m benchmarks.device_serve_bench --out-dir DIR [--model smollm2]"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from pagedserve.services.cli.ports import free_port

STOP_TIMEOUT_S = 30.0
# The pagedserve console script, or the same entry point where the package is not installed.
ENTRY_POINT = "import sys; from services.cli import main; sys.exit(main())"


def pagedserve_argv() -> list[str]:
    script = shutil.which("pagedserve")
    return [script] if script else [sys.executable, "-c", ENTRY_POINT]


def serve_argv(model: str, port: int) -> list[str]:
    return [*pagedserve_argv(), "serve", "--model", model, "--device", "cuda", "--port", str(port)]


def bench_argv(model: str, port: int, out_dir: Path, num_prompts: int) -> list[str]:
    return [
        *pagedserve_argv(), "bench",
        "--base-url", f"http://127.0.0.1:{port}",
        "--model", model,
        "--tokenizer", model,
        "--num-prompts", str(num_prompts),
        "--ready-timeout", "240",
        "--hf-baseline", "--hf-device", "cuda", "--hf-dtype", "bfloat16",
        "--hf-batch-sizes", "32,64",
        "--no-plots",
        "--out", str(out_dir / "serve_bench"),
    ]  # fmt: skip


def stop(server: subprocess.Popen) -> None:
    """SIGTERM the server's process group (a graceful drain), SIGKILL if it lingers."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-prompts", type=int, default=128)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with (args.out_dir / "serve.log").open("w") as log:
        server = subprocess.Popen(
            serve_argv(args.model, port), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            # bench waits for /health, streams the workload, then runs HF generate
            return subprocess.run(
                bench_argv(args.model, port, args.out_dir, args.num_prompts)
            ).returncode
        finally:
            stop(server)


if __name__ == "__main__":
    sys.exit(main())
