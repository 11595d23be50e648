"""A frozen inference server — it accepts connections and never answers, as a vLLM process stuck in a
collective does — against a slow one that still answers its health probe: only the frozen one counts
towards the circuit, so the run pauses admission and fails once with the reason instead of failing every
trajectory of the workload in turn, one request timeout each."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar, Self

import pytest

from asyncroll.events import ModelFailed, ServerUnavailable, TrajectoryStarted
from tests.http_backend import final_problems, http_run
from tests.loopback import LoopbackServer


class FrozenServer:
    """Listens on loopback, accepts every connection and holds it open without reading or answering."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = self._sock.accept()
                self._held.append(conn)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()


class SlowHandler(BaseHTTPRequestHandler):
    """``/health`` answers at once (each probe counted); a completion takes longer than the run's request
    timeout."""

    probes: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        SlowHandler.probes.append(self.path)
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        time.sleep(1.0)
        with contextlib.suppress(OSError):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


SETTINGS: dict[str, Any] = {
    "request_timeout": 0.3,
    "circuit_failures": 2,
    "server_down_timeout": 0.5,
    "telemetry": False,
}


@pytest.mark.timeout(60)
def test_a_frozen_server_opens_the_circuit_and_fails_the_run_once(tmp_path: Path) -> None:
    with FrozenServer() as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(10), server.url, max_active_trajectories=2, **SETTINGS
        )
    # It used to time out request after request: all ten trajectories failed, the run "complete".
    assert outcome.status == "failed" and outcome.error is not None, outcome.status
    assert "stayed unavailable" in outcome.error and "last probe: GET /health" in outcome.error
    [opened] = capture.of(ServerUnavailable)
    assert opened.reason.startswith("timeout: ") and "; then GET /health" in opened.reason, opened.reason
    started, failed = capture.of(TrajectoryStarted), capture.of(ModelFailed)
    assert len(started) in (2, 3)  # the rest never admitted
    # the first two time out; a third, admitted when one of them failed, may have its request out when the
    # run fails, and the stop cancels it (seen on a loaded machine)
    assert {e.kind for e in failed} - {"cancelled"} == {"timeout"}
    cancelled = {e.id for e in failed if e.kind == "cancelled"}
    assert cancelled <= {s.id for s in started[2:]}, cancelled


@pytest.mark.timeout(60)
@pytest.mark.parametrize("circuit_failures", [2, 0])
def test_a_slow_server_that_answers_its_health_probe_never_opens_the_circuit(
    tmp_path: Path, circuit_failures: int
) -> None:
    """Each timeout is followed by one health probe, which answers: the circuit stays closed. With the
    circuit off (``--circuit-failures 0``) no health probe is sent: nothing would count it."""
    SlowHandler.probes.clear()
    settings = {**SETTINGS, "circuit_failures": circuit_failures}
    with LoopbackServer(SlowHandler) as server:
        outcome, capture, _ = http_run(
            tmp_path, final_problems(4), server.url, max_active_trajectories=4, **settings
        )
    assert outcome.status == "complete", outcome.error
    assert not capture.of(ServerUnavailable)
    assert [e.kind for e in capture.of(ModelFailed)] == ["timeout"] * 4
    # the start's one GET /version (answered 404 here), then a health probe per timeout
    assert SlowHandler.probes == ["/version", *(["/health"] * 4 if circuit_failures else [])]
