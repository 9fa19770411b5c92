"""A real HTTP server on loopback that records requests and answers as scripted
(200, 429 with Retry-After, 500, 400, or a hang past the client's timeout). GET and
PATCH are recorded too and answered 200 with ``get_body`` (an API server's object)."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    method: str = "POST"

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Recorder:
    """Start with ``with Recorder() as rec``; ``rec.script`` holds answers to give next
    (``200``, ``429``, ``500``, ``400``, ``"hang"``), then 200 for the rest."""

    script: deque[int | str] = field(default_factory=deque)
    requests: list[Recorded] = field(default_factory=list)
    retry_after: str = "1"
    hang_seconds: float = 3.0
    port: int = 0  # 0: any free port
    get_body: bytes = b"{}"

    def __enter__(self) -> Recorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.requests.append(Recorded(self.path, dict(self.headers), body,
                                                  time.monotonic()))
                answer = recorder.script.popleft() if recorder.script else 200
                if answer == "hang":
                    time.sleep(recorder.hang_seconds)
                    answer = 200
                self.send_response(int(answer))
                if answer == 429:
                    self.send_header("Retry-After", recorder.retry_after)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def _json(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.requests.append(Recorded(self.path, dict(self.headers), body,
                                                  time.monotonic(), self.command))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(recorder.get_body)))
                self.end_headers()
                self.wfile.write(recorder.get_body)

            do_GET = do_PATCH = _json

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Recorded]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.requests
