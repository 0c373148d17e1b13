"""How much a huge prompt costs the gateway: a real gateway process (default model's tokenizer,
its own max_model_len) and three concurrent ~8 MB prompts with no API key, as in issue 13.

Reports each refusal's time, the gateway's RSS growth (peak and after), and /health's latency
while the big prompts are in flight, as one result line:

    python -m benchmarks.oversized_prompt [--model smollm2] [--prompt-mb 8] [--concurrency 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

import httpx
import psutil

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import RedisServer


def start_gateway(model: str, redis_url: str, port: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-P", "-m", "pagedserve.services.gateway", "--model", model,
            "--redis-url", redis_url, "--port", str(port), "--namespace", "oversized"]  # fmt: skip
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
            return process
        except httpx.TransportError:
            if process.poll() is not None:
                raise RuntimeError("the gateway exited at start") from None
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the gateway did not start within 180 s")


class Sampler(threading.Thread):
    """Peak RSS of the gateway and /health latencies, until stopped."""

    def __init__(self, pid: int, base_url: str) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.base_url = base_url
        self.peak_rss = self.process.memory_info().rss
        self.health_s: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            while not self.done.is_set():
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
                started = time.monotonic()
                client.get("/health")
                self.health_s.append(time.monotonic() - started)
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)


def refuse_times(base_url: str, prompt_chars: int, concurrency: int) -> list[tuple[int, float]]:
    results: list[tuple[int, float]] = []

    def send() -> None:
        started = time.monotonic()
        answer = httpx.post(
            f"{base_url}/v1/completions", json={"prompt": "x" * prompt_chars}, timeout=600
        )
        results.append((answer.status_code, time.monotonic() - started))

    threads = [threading.Thread(target=send) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompt-mb", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=3)
    args = parser.parse_args()
    prompt_chars = int(args.prompt_mb * 1024 * 1024) - 1024  # under the 8 MiB body limit
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with RedisServer(free_port()) as redis_server:
        gateway = start_gateway(args.model, redis_server.url, port)
        try:
            rss = psutil.Process(gateway.pid)
            baseline = rss.memory_info().rss
            sampler = Sampler(gateway.pid, base_url)
            sampler.start()
            results = refuse_times(base_url, prompt_chars, args.concurrency)
            sampler.done.set()
            sampler.join()
            time.sleep(0.5)
            after = rss.memory_info().rss
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
    mib = 1024 * 1024
    times = sorted(t for _, t in results)
    print(
        f"oversized_prompt: {args.concurrency} x {prompt_chars / mib:.1f} MiB prompts -> "
        f"status {sorted({s for s, _ in results})}, refused in {times[0]:.2f}-{times[-1]:.2f} s; "
        f"gateway RSS +{(sampler.peak_rss - baseline) / mib:.0f} MiB peak, "
        f"+{(after - baseline) / mib:.0f} MiB after; /health median "
        f"{statistics.median(sampler.health_s) * 1000:.0f} ms, max "
        f"{max(sampler.health_s) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
