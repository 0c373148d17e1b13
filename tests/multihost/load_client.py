"""Streaming load through the `openai` client, run on the client host of tests/multihost:

    python -P tests/multihost/load_client.py CONFIG.json RESULTS.json

`concurrency` workers each send greedy streaming completions one after another, alternating
gateways, until `num_requests` were sent or `stop_file` exists (bounded by `deadline_s`); with a
`go_file`, they start when it appears (`ready_file` says the client is up and has sent one
short request through each gateway, so that the load starts at once). What
each client saw is written to RESULTS.json: its text, finish reason, the longest pause between
two pieces, and any error. A request refused before its first piece (503: Redis unreachable;
no connection) is sent again after a pause, as a client should, and the refusal counted; an
error after the first piece is recorded, never retried. `PROGRESS` gets a line per piece
batch so the test can see the load flowing. Standalone on purpose: it imports only openai.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import openai

RETRY_PAUSE_S = 0.5


async def one_request(client: openai.AsyncOpenAI, config: dict, prompt_index: int) -> dict:
    record = {"prompt_index": prompt_index, "text": "", "finish_reason": None, "error": None,
              "refusals": [], "max_gap_s": 0.0, "started_at": time.time()}  # fmt: skip
    deadline = time.monotonic() + config["deadline_s"]
    while True:
        try:
            await _stream(client, config, prompt_index, record)
            break
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            if record["text"] or time.monotonic() > deadline:
                record["error"] = repr(exc)
                break
            record["refusals"].append(repr(exc)[:200])
            await asyncio.sleep(RETRY_PAUSE_S)
        except Exception as exc:
            record["error"] = repr(exc)
            break
    record["finished_at"] = time.time()
    return record


async def _stream(client: openai.AsyncOpenAI, config: dict, prompt_index: int, record: dict):
    stream = await client.completions.create(
        model=config["model"],
        prompt=config["prompts"][prompt_index],
        max_tokens=config["max_tokens"],
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    last = time.monotonic()
    async for chunk in stream:
        now = time.monotonic()
        if record["text"]:
            record["max_gap_s"] = max(record["max_gap_s"], now - last)
        last = now
        for choice in chunk.choices:
            record["text"] += choice.text or ""
            record["finish_reason"] = choice.finish_reason or record["finish_reason"]
        with open(config["progress_file"], "a") as progress:
            progress.write(f"{prompt_index}\n")


async def worker(index: int, clients: list[openai.AsyncOpenAI], config: dict, out: list) -> None:
    stop_file = Path(config["stop_file"]) if config.get("stop_file") else None
    num_prompts = len(config["prompts"])
    end = time.monotonic() + config["deadline_s"]
    sent = 0
    while time.monotonic() < end:
        number = index + sent * config["concurrency"]
        if number >= config["num_requests"] or (stop_file and stop_file.exists()):
            return
        client = clients[(index + sent) % len(clients)]
        record = await one_request(client, config, number % num_prompts)
        record["gateway"] = str(client.base_url)
        out.append(record)
        sent += 1


async def warm_up(client: openai.AsyncOpenAI, config: dict) -> None:
    stream = await client.completions.create(
        model=config["model"], prompt=config["prompts"][0], max_tokens=1, stream=True
    )
    async for _ in stream:
        pass


async def main(config: dict) -> list[dict]:
    clients = [
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=180)
        for url in config["base_urls"]
    ]
    out: list[dict] = []
    go_file = Path(config["go_file"]) if config.get("go_file") else None
    if go_file is not None:  # the first request of a client is slow (imports, connections)
        await asyncio.gather(*(warm_up(client, config) for client in clients))
    Path(config["ready_file"]).touch()
    while go_file is not None and not go_file.exists():
        await asyncio.sleep(0.01)
    await asyncio.gather(*(worker(i, clients, config, out) for i in range(config["concurrency"])))
    return out


if __name__ == "__main__":
    settings = json.loads(Path(sys.argv[1]).read_text())
    results = asyncio.run(main(settings))
    Path(sys.argv[2]).write_text(json.dumps(results))
