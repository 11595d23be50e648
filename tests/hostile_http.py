"""A loopback server that writes whole HTTP answers itself (odd statuses, encodings, trickles), for the
OpenAI-compatible backend's tests of replies no real server sends."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.loopback import LoopbackServer, trickle


def trickle_json(handler: Any, stop: threading.Event) -> None:
    trickle(handler, stop, "application/json")


def raw_reply(status: int, headers: dict[str, str], body: bytes) -> Any:
    def reply(handler: Any, stop: threading.Event) -> None:
        handler.send_response(status)
        for name, value in {**headers, "content-length": str(len(body))}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    return reply


class HostileServer(LoopbackServer):
    """A loopback server whose chat replies are ``replies`` in turn (callables writing the whole HTTP
    answer, then the last again) and whose GET routes are ``gets`` (path → callable; else 200 ``{}``)."""

    def __init__(self, replies: list[Any], gets: dict[str, Any] | None = None) -> None:
        stop = self._stop = threading.Event()
        served, last, routes = iter(replies), [replies[-1]], gets or {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                routes.get(self.path, raw_reply(200, {"content-type": "application/json"}, b"{}"))(self, stop)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                last[0] = next(served, last[0])
                last[0](self, stop)

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(Handler)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # first: a handler still trickling ends, so shutdown does not wait for it
        super().__exit__(*exc)


def json_reply(body: Any) -> Any:
    return raw_reply(200, {"content-type": "application/json"}, json.dumps(body).encode())
