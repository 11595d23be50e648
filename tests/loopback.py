"""A real threaded HTTP server on a free loopback port, for tests that need a server to misbehave in a
way no library server would (odd bodies, trickles, resets)."""

from __future__ import annotations

import contextlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LoopbackServer:
    """Serves ``handler`` on 127.0.0.1 while in a ``with``; ``url`` is its base address."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        #: what the handler threads raised (a client that hung up, a TLS handshake it refused): kept here,
        #: never printed — socketserver printed it to stderr, where a handler thread still running after
        #: its test ended put a traceback into a later test's captured stderr
        self.errors: list[BaseException] = []
        errors = self.errors

        class Server(ThreadingHTTPServer):
            daemon_threads = True  # a handler still writing never holds up the test's end

            def handle_error(self, request: object, client_address: object) -> None:
                error = sys.exc_info()[1]
                if error is not None:
                    errors.append(error)

        self._server = Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def trickle(
    handler: BaseHTTPRequestHandler, stop: threading.Event, content_type: str, every_s: float = 0.1
) -> None:
    """Answer 200 with headers at once, then one byte of a 1 MB body every ``every_s`` until ``stop``
    (or the client leaves): each byte resets httpx's per-phase read timeout, so only a whole-exchange
    deadline ends the read."""
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", "1000000")
    handler.end_headers()
    with contextlib.suppress(OSError):
        while not stop.wait(every_s):
            handler.wfile.write(b" ")
            handler.wfile.flush()
