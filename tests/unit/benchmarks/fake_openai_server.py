"""A stand-in OpenAI-compatible server on loopback for `pagedserve bench` tests: `/health` and
a streaming `/v1/completions` that answers `max_tokens` one-word chunks at once and records
every prompt it was sent, in arrival order (and every request body). No model, so a sweep
takes milliseconds. `send_done=False` ends streams without `data: [DONE]`, as `transformers
serve` does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    server: _RecordingServer

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.prompts.append(body["prompt"])
            self.server.bodies.append(body)
        events = [{"choices": [{"index": 0, "text": " x", "finish_reason": None}]}]
        events *= body["max_tokens"]
        usage = {
            "prompt_tokens": len(body["prompt"].split()),
            "completion_tokens": body["max_tokens"],
        }
        events.append({"choices": [], "usage": usage})
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        if self.server.send_done:
            stream += "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        # One write: small writes one by one meet Nagle and delayed ACKs (40 ms each).
        self.wfile.write(stream.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean


class _RecordingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, send_done: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.send_done = send_done
        self.bodies: list[dict] = []
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


@contextmanager
def fake_openai_server(send_done: bool = True) -> Iterator[_RecordingServer]:
    server = _RecordingServer(send_done)
    # A short poll interval: shutdown() waits for the loop's next poll.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
