"""An arm's inference server that misbehaves: answers non-JSON, dies while the client runs, ignores
SIGTERM, trickles its readiness answer; and what its startup log records."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import asyncroll
from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import InferenceServer, ManagedProcess
from tests.experiments import alive, kill_recorded, read, recorded_processes
from tests.lean_experiment import lean


@pytest.mark.timeout(60)
def test_a_server_answering_non_json_fails_its_arm_at_starting_server(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "v1").mkdir(parents=True)
    (site / "health").write_text("ok")
    (site / "v1" / "models").write_text("not json")
    command = ["{python}", "-m", "http.server", "--bind", "{host}", "--directory", str(site), "{port}"]
    cfg = lean(tmp_path, server={"command": command, "kind": "generic", "port": 0, "startup_timeout_s": 20})
    out = tmp_path / "out"
    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert outcome.status == "complete" and outcome.exit_code == 1
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        arm = read(out / "arms" / arm_id / "arm.json")
        assert arm["status"] == "failed" and arm["failed_step"] == "starting_server"
        assert arm["error"].startswith("/v1/models did not return JSON")
    assert any(line.startswith("[pair1-fifo] failed: /v1/models did not return JSON") for line in lines)
    assert not any(alive(p) for p in recorded_processes(out))


@pytest.mark.timeout(90)
def test_a_server_that_dies_while_the_client_runs_fails_the_arm_at_once(tmp_path: Path) -> None:
    """kill -9 of the server mid-arm: the client is stopped promptly and the arm's error names the
    server's death and its log, not a client deadline."""
    import threading
    import time

    from tests.experiments import SMOKE

    command = json.loads(SMOKE.read_text())["server"]["command"]
    command[command.index("--step-base-ms") + 1] = "150"  # a client that runs for a while
    # one arm: the qualification stage's, which fails and stops the experiment before the pairs (a
    # second arm, on this slowed server, only took time)
    one_arm = {"qualification": {"arms": ["fifo"], "gates": []}}
    cfg = lean(tmp_path, **{"server.command": command, "client.deadline_s": 45, "stages": one_arm})
    out = tmp_path / "out"
    arm_json = out / "arms" / "qualification-1-fifo" / "arm.json"
    killed: list[float] = []

    def kill_server() -> None:
        end = time.monotonic() + 40
        while time.monotonic() < end:
            try:
                data = read(arm_json)
            except (OSError, ValueError):
                data = {}
            try:  # the client's own run is measuring: its backend started (and asked the version)
                running = read(arm_json.parent / "run" / "run.json").get("status") == "running"
            except (OSError, ValueError):
                running = False
            if data.get("status") == "running_client" and running:
                time.sleep(0.5)
                os.kill(data["server"]["process"]["pid"], signal.SIGKILL)
                killed.append(time.monotonic())
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_server, daemon=True)
    watcher.start()
    try:
        outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
    finally:
        watcher.join(5)
        kill_recorded(out)
    assert killed
    assert outcome.status == "stopped" and not (out / "arms" / "pair1-fifo").exists()
    arm = read(arm_json)
    assert arm["status"] == "failed" and arm["failed_step"] == "running_client"
    assert arm["error"].startswith("server was killed by SIGKILL (exit code -9) while the client ran")
    assert re.search(r"the client was stopped \(it (exited with code|was killed by SIG)", arm["error"])
    assert str(out / "arms" / "qualification-1-fifo" / "server.log") in arm["error"]
    assert arm["client"]["wall_s"] < 15  # not the client's 45 s deadline
    assert not any(alive(p) for p in recorded_processes(out))
    # the engine version its client got is listed, as a failed arm's server log versions are
    versions = read(out / "comparison.json")["server_versions"]
    assert versions.get("GET /version") == [f"asyncroll serve-sim {asyncroll.__version__}"], versions


def test_startup_evidence_records_attention_backend_names_as_logged() -> None:
    from asyncroll.experiment.server import startup_evidence

    log = "\n".join(
        [
            "INFO [cuda.py:240] Using Flash Attention backend on V1 engine.",
            "INFO: Using sampling backend: flashinfer",
            "INFO [cuda.py:250] Using Triton MLA backend on V1 engine.",
            "INFO [selector.py:40] Using FLASH_ATTN attention backend out of potential backends: ['X']",
            "server_args=ServerArgs(attention_backend='fa3', sampling_backend='pytorch')",
        ]
    )
    ev = startup_evidence(log)
    assert ev["attention_backend"] == ["Flash Attention", "Triton MLA", "FLASH_ATTN", "fa3"]
    assert ev["sampling_backend"] == ["flashinfer", "pytorch"]


@pytest.mark.timeout(30)
def test_a_server_ignoring_sigterm_is_killed_after_one_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TERM → grace → KILL: the leader and its child both ignore TERM; KILL comes after stop_grace_s in
    total, not once for the leader and again for its tree."""
    import time

    import asyncroll.experiment.server as server_module
    from asyncroll.proctree import descendants

    sent: list[tuple[int, float]] = []

    def signal_tree(pid: int, sig: int, tree: list[Any]) -> None:
        sent.append((sig, time.monotonic()))
        real(pid, sig, tree)

    real = server_module.signal_tree
    monkeypatch.setattr(server_module, "signal_tree", signal_tree)
    process = ManagedProcess(["bash", "-c", "trap '' TERM; sleep 60 & wait"], tmp_path / "server.log")
    process.start()
    try:
        end = time.monotonic() + 10
        while not descendants(process.pid) and time.monotonic() < end:
            time.sleep(0.02)
        assert descendants(process.pid)
        stop = process.stop(2.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert stop["how"] == "kill" and stop["leftover"] == []
    # one grace (2 s) between TERM and KILL, not two (4 s). Timed between the two signals only, not the
    # whole stop (the wait for the killed group and the adoption scan after it stretched on a loaded
    # machine: a whole-stop window of 2–3 s failed once); the margin below 4 s absorbs scheduling delays.
    [(term, term_at), (kill, kill_at)] = sent
    assert (term, kill) == (signal.SIGTERM, signal.SIGKILL)
    assert 2.0 <= kill_at - term_at < 3.8, sent


TRICKLING_HEALTH = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 1000000\\r\\n\\r\\n")
    try:
        while True:  # one byte at a time: every read of httpx's finishes within its per-phase timeout
            conn.sendall(b" ")
            time.sleep(0.5)
    except OSError:
        conn.close()
"""


@contextlib.contextmanager
def _serving(tmp_path: Path, script: str, *args: str) -> Iterator[InferenceServer]:
    """``script`` (``python -c``) started as an arm's server on a free loopback port; stopped after."""
    from asyncroll.experiment.server import InferenceServer, free_port

    port = free_port("127.0.0.1")
    command = [sys.executable, "-c", script, str(port), *args]
    server = InferenceServer(command, f"http://127.0.0.1:{port}", tmp_path / f"server-{port}.log", {}, "m")
    server.start()
    try:
        yield server
    finally:
        server.stop(2.0)


@pytest.mark.timeout(60)
def test_a_server_that_trickles_its_readiness_answer_times_out_at_the_deadline(tmp_path: Path) -> None:
    """Readiness probes had only httpx's per-phase timeout, which each trickled byte resets: a server
    answering /health one byte at a time held the arm in ``starting_server`` for ever."""
    from asyncroll.experiment.server import PROBE_TIMEOUT_S, ReadinessTimeout
    from asyncroll.http_read import request_deadline_s

    with _serving(tmp_path, TRICKLING_HEALTH) as server:
        began = time.monotonic()
        with pytest.raises(ReadinessTimeout, match="no complete answer within"):
            server.wait_ready(["/health"], 3.0)  # room for a slow start: ConnectError until it listens
        # each probe gets at most the time left, and its deadline is at most max(1 s, 10%) more
        assert time.monotonic() - began < 3.0 + request_deadline_s(PROBE_TIMEOUT_S) - PROBE_TIMEOUT_S + 2.0


MODELS_NOT_YET = """
import http.server, json, sys
port, busy = int(sys.argv[1]), int(sys.argv[2])  # /v1/models answers 502 this many times (-1: always)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global busy
        if self.path == "/v1/models" and busy:
            busy -= 1
            code, body = 502, b"bad gateway"
        elif self.path == "/v1/models":
            code, body = 200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
        else:
            code, body = 200, b""
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _listening(server: InferenceServer, within_s: float = 30.0) -> None:
    """Wait until ``server``'s port accepts a connection (its interpreter started: seconds on a loaded
    machine)."""
    url = urlsplit(server.base_url)
    deadline = time.monotonic() + within_s
    while True:
        try:
            socket.create_connection((url.hostname, url.port), timeout=1.0).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{server.base_url} not listening within {within_s:g}s"
            time.sleep(0.05)


@pytest.mark.timeout(60)
def test_a_model_list_not_yet_served_is_asked_again_until_the_deadline(tmp_path: Path) -> None:
    """/health said ready while /v1/models still answered 502 (a server behind a proxy still starting):
    the arm failed at once, "/v1/models answered HTTP 502", though its readiness deadline had time left.
    No answer, a 429 or a 5xx is now asked again until the deadline; a wrong answer is still final."""
    from asyncroll.experiment.server import ReadinessTimeout

    for busy in (3, -1):
        with _serving(tmp_path, MODELS_NOT_YET, str(busy)) as server:
            if busy > 0:
                ready = server.wait_ready(["/health"], 20.0)
                assert ready["models"] == ["m"] and ready["via"] == "/health", ready
            else:
                _listening(server)  # the 3 s below are the model list's, not the interpreter's start
                with pytest.raises(
                    ReadinessTimeout, match=r"within 3s \(last: /(v1/models|health): "
                ) as timed_out:
                    server.wait_ready(["/health"], 3.0)
                # asked again and again until the deadline (not refused at its first 502); the last ask,
                # given only the time left, may end with no answer on a loaded machine
                assert str(timed_out.value).count('"GET /v1/models HTTP/1.1" 502') >= 2, timed_out.value


@pytest.mark.parametrize(
    ("stopped", "code", "said"),
    [
        (True, 130, "the client was stopped (it exited with code 130); "),
        (True, None, "the client was stopped; "),  # no exit status came back: not 'exited with code None'
        (False, 1, "the client then exited with code 1; "),  # it ended on its own: nobody stopped it
    ],
)
def test_a_server_that_died_says_how_the_client_ended(
    tmp_path: Path, stopped: bool, code: int | None, said: str
) -> None:
    from types import SimpleNamespace
    from typing import cast

    from asyncroll.experiment import arms
    from asyncroll.experiment.server import InferenceServer

    log = tmp_path / "server.log"
    log.write_text("")
    server = cast(InferenceServer, SimpleNamespace(process=SimpleNamespace(poll=lambda: -9, log=log)))
    text = arms._server_died(server, code, stopped=stopped)
    assert text.startswith(f"server was killed by SIGKILL (exit code -9) while the client ran; {said}"), text


MODELS_HANG = """
import http.server, sys, time
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v1/models":
            time.sleep(3600)  # never answers
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.mark.timeout(90)
def test_a_model_list_that_never_comes_is_given_only_the_time_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/models, asked again until the readiness deadline, was given a whole probe's time however little
    was left: a server whose /health said ready and whose /v1/models never answered held the arm past
    its deadline by up to a probe (here made 30 s, so that the two cannot be confused on a slow machine)."""
    from asyncroll.experiment import server as server_module
    from asyncroll.experiment.server import ReadinessTimeout

    monkeypatch.setattr(server_module, "PROBE_TIMEOUT_S", 30.0)
    with _serving(tmp_path, MODELS_HANG) as server:
        _listening(server)  # the 3 s below are the model list's, not the interpreter's start
        began = time.monotonic()
        with pytest.raises(ReadinessTimeout, match=r"\(last: /v1/models: "):
            server.wait_ready(["/health"], 3.0)
        assert time.monotonic() - began < 15.0  # 3 s and a probe's margin (max(1 s, 10%)); was over 30 s


@pytest.mark.timeout(60)
def test_who_listens_is_not_looked_at_again_for_every_ask_of_the_model_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/models asked again until the deadline looked at who listens on the port (a scan of every
    process's sockets) before every ask: here 4 times for 3 answers of 502. Now at the first 200 (another's
    server is said at once) and once more when the model is listed."""
    looked: list[int] = []
    owner = InferenceServer._owner

    def counted(self: InferenceServer) -> dict[str, object]:
        looked.append(1)
        return owner(self)

    monkeypatch.setattr(InferenceServer, "_owner", counted)
    with _serving(tmp_path, MODELS_NOT_YET, "3") as server:
        ready = server.wait_ready(["/health"], 20.0)
        assert ready["models"] == ["m"] and ready["listener"]["verified"] is not None, ready
    assert len(looked) == 2, looked  # was 4
