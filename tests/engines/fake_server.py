"""A tiny scripted HTTP server on loopback for client tests (JSON and SSE answers)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# handler(path, body) -> (status, payload); payload: dict -> JSON, list[dict] -> SSE stream,
# bytes -> sent as-is with content-type application/json (malformed answers)
Handler = Callable[[str, dict[str, Any]], tuple[int, Any]]


class FakeServer:
    """Records requests, tracks concurrency, answers with `handler`."""

    def __init__(self, handler: Handler, delay_s: float = 0.0, chunk_delay_s: float = 0.0) -> None:
        self.handler = handler
        self.delay_s = delay_s
        self.chunk_delay_s = chunk_delay_s
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        self.url = ""


@contextmanager
def serve(fake: FakeServer) -> Iterator[FakeServer]:
    """Run `fake` on 127.0.0.1 (a free port) for the duration of the block."""

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._answer({})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self._answer(json.loads(self.rfile.read(length) or b"{}"))

        def _answer(self, body: dict[str, Any]) -> None:
            # A request counts as active until just before its last bytes go out: a client that
            # got its answer may send the next request before this thread reaches `finally`.
            finished = False

            def finish() -> None:
                nonlocal finished
                if not finished:
                    finished = True
                    with fake.lock:
                        fake.active -= 1

            with fake.lock:
                fake.requests.append((self.path, body))
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                fake.active += 1
                fake.max_active = max(fake.max_active, fake.active)
            try:
                time.sleep(fake.delay_s)
                status, payload = fake.handler(self.path, body)
                if isinstance(payload, list):
                    self.send_response(status)
                    self.send_header("content-type", "text/event-stream")
                    self.end_headers()
                    for chunk in payload:
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                        time.sleep(fake.chunk_delay_s)
                    finish()
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                finish()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                finish()

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
