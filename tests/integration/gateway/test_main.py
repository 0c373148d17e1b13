"""`python -m pagedserve.services.gateway` as a real process: flags and PAGEDSERVE_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from pagedserve.shared.protocol import decode
from tests.integration.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, info) -> Path:
    """A model directory holding only what the gateway reads: tokenizer files and config."""
    path = tmp_path_factory.mktemp("model")
    info.tokenizer.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    return path


def test_module_entry_point(redis_url, model_dir):
    port = free_port()
    env = {**os.environ, "PAGEDSERVE_API_KEY": "sk-env", "PAGEDSERVE_SERVED_MODEL_NAME": "tiny"}
    args = [sys.executable, "-P", "-m", "pagedserve.services.gateway", "--model", str(model_dir),
            "--port", str(port), "--redis-url", redis_url, "--namespace", "maintest"]  # fmt: skip
    process = subprocess.Popen(args, env=env, stderr=subprocess.PIPE)
    try:
        headers = {"Authorization": "Bearer sk-env"}
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            while True:
                try:
                    models = c.get("/v1/models", headers=headers)
                    break
                except httpx.TransportError:
                    assert process.poll() is None, process.stderr.read().decode()
                    assert time.monotonic() < deadline, "the gateway did not come up"
                    time.sleep(0.1)
            (card,) = models.json()["data"]
            assert card["id"] == "tiny" and card["max_model_len"] == 512
            assert c.get("/v1/models").status_code == 401
            body = {"model": "tiny", "prompt": "x" * 10, "max_tokens": 600}
            r = c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 400 and "512" in r.json()["error"]["message"]
            # No engine runs: the request waits in the queue; check what was queued.
            with pytest.raises(httpx.ReadTimeout):
                body = {"messages": [{"role": "user", "content": "hi"}]}
                c.post("/v1/chat/completions", json=body, headers=headers, timeout=1)
        queued = redis.Redis.from_url(redis_url).xrange("maintest:requests")
        (request,) = [decode(fields[b"m"]) for _, fields in queued]
        assert request.sampling.eos_token_ids == (2, 7)  # tokenizer + generation_config.json
        # chat without max_tokens: what the context leaves (completions default to 16)
        assert request.sampling.max_tokens == 512 - len(request.prompt_token_ids)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_bad_flag_is_a_clear_error():
    args = [
        sys.executable,
        "-P",
        "-m",
        "pagedserve.services.gateway",
        "--max-pending-requests",
        "0",
    ]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "max_pending_requests must be >= 1, got 0" in result.stderr
