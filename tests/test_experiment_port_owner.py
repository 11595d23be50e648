"""An arm measures its own server, not a neighbour's: a port chosen by ``free_port`` is free only until
the server binds it, and a real server loads its model for tens of seconds before it listens. Another
process holding that port (a neighbour's experiment, a user's own vLLM serving the same model name)
answered the readiness probes, and the arm's whole measurement ran against it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncroll.experiment import listener
from asyncroll.experiment.server import InferenceServer, ServerStartError, free_port, port_in_use


def neighbour_serve_sim(port: int, log: Path) -> subprocess.Popen[bytes]:
    """``asyncroll serve-sim`` on ``port`` serving the model ``m``, listening when this returns. Waits while
    it runs, however long (the test's hard timeout bounds it, and kills it then): its imports took 4 s at a
    load of 8, and a fixed 30 s told a slow start on a loaded machine from a failed one by a guess."""
    command = [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", str(port), "--model", "m"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        while not port_in_use("127.0.0.1", port):
            if proc.poll() is not None:
                pytest.fail(f"the neighbour serve-sim ended ({proc.returncode}): {log.read_text()}")
            time.sleep(0.05)
    except BaseException:  # pytest-timeout's failure too
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


@pytest.mark.timeout(120)
def test_a_neighbour_holding_the_port_is_not_taken_for_the_arms_server(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    neighbour = neighbour_serve_sim(port, tmp_path / "neighbour.log")
    # ours never binds (a vLLM still loading its model, or one that will fail to bind)
    server = InferenceServer(["sleep", "60"], f"http://127.0.0.1:{port}", tmp_path / "server.log", {}, "m")
    try:
        server.start()
        with pytest.raises(ServerStartError) as caught:
            server.wait_ready(["/health", "/v1/models"], 20.0)
    finally:
        server.stop(2.0)
        stop(neighbour)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert f"pid {neighbour.pid}" in message and "serve-sim" in message  # who holds it
    assert "Stop it" in message and "server.port" in message  # what to do


@pytest.mark.timeout(120)
def test_a_server_whose_listener_is_not_checked_is_trusted_and_recorded_so(tmp_path: Path) -> None:
    """``server.check_listener: false``: a container's daemon listens outside the command's processes,
    so the check would fail every arm; whoever answers is then trusted, and arm.json says it was not
    checked."""
    from asyncroll.experiment.config import ServerSpec

    assert ServerSpec().check_listener is True
    assert ServerSpec.model_validate({"check_listener": False}).check_listener is False
    port = free_port("127.0.0.1")
    neighbour = neighbour_serve_sim(port, tmp_path / "neighbour.log")  # stands in for the daemon's proxy
    url = f"http://127.0.0.1:{port}"
    server = InferenceServer(["sleep", "60"], url, tmp_path / "server.log", {}, "m", check_listener=False)
    try:
        server.start()
        ready = server.wait_ready(["/health", "/v1/models"], 20.0)
    finally:
        server.stop(2.0)
        stop(neighbour)
    assert ready["listener"] == {"verified": False, "why": "not checked: server.check_listener is false"}


@pytest.mark.timeout(60)
def test_our_own_server_listening_is_recorded_as_the_owner(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", str(port), "--model", "m"]
    server = InferenceServer(command, f"http://127.0.0.1:{port}", tmp_path / "server.log", {}, "m")
    try:
        server.start()
        ready = server.wait_ready(["/health", "/v1/models"], 30.0)
    finally:
        server.stop(5.0)
    owner = ready["listener"]
    assert owner["verified"] is True and owner["pid"] == server.process.pid
    assert owner["address"] == f"127.0.0.1:{port}"


@pytest.mark.timeout(60)
def test_a_listener_the_server_started_in_a_child_counts_as_its_own(tmp_path: Path) -> None:
    """A shell or launcher that runs the real server as its child (vLLM's API server, SGLang)."""
    port = free_port("127.0.0.1")
    serve = f"{sys.executable} -m asyncroll.cli serve-sim --port {port} --model m; true"
    server = InferenceServer(["sh", "-c", serve], f"http://127.0.0.1:{port}", tmp_path / "s.log", {}, "m")
    try:
        server.start()
        ready = server.wait_ready(["/health"], 30.0)
        child = ready["listener"]["pid"]
        assert child != server.process.pid and psutil.Process(child).ppid() == server.process.pid
    finally:
        server.stop(5.0)
    assert ready["listener"]["verified"] is True


@pytest.mark.timeout(60)
def test_a_platform_that_cannot_tell_whose_socket_it_is_records_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(proc: psutil.Process) -> list[Any]:
        raise NotImplementedError("no socket table here")

    monkeypatch.setattr(listener, "inet_sockets", unsupported)
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", str(port), "--model", "m"]
    server = InferenceServer(command, f"http://127.0.0.1:{port}", tmp_path / "server.log", {}, "m")
    try:
        server.start()
        ready = server.wait_ready(["/health"], 30.0)
    finally:
        server.stop(5.0)
    assert ready["listener"]["verified"] is False
    assert "no socket table here" in ready["listener"]["why"]


def test_both_psutil_spellings_of_a_processs_sockets_are_used() -> None:
    """``Process.net_connections`` exists from psutil 6.0 on; older versions (the floor is 5.9) call it
    ``connections``."""

    class Old:
        def connections(self, kind: str) -> list[str]:
            return [f"old {kind}"]

    class New(Old):
        def net_connections(self, kind: str) -> list[str]:
            return [f"new {kind}"]

    assert listener.inet_sockets(Old()) == ["old inet"]  # type: ignore[arg-type]
    assert listener.inet_sockets(New()) == ["new inet"]  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_the_transformers_bench_does_not_measure_a_neighbour_on_its_port(tmp_path: Path) -> None:
    """``bench.transformers_serve`` picks its port the same way and waited for any ``/health`` answer."""
    from bench.transformers_serve import Engine, wait_ready

    port = free_port("127.0.0.1")
    neighbour = neighbour_serve_sim(port, tmp_path / "neighbour.log")
    ours = subprocess.Popen(["sleep", "60"], start_new_session=True)  # still loading its model
    engine = Engine(f"http://127.0.0.1:{port}", "m", ours, tmp_path / "server.log")
    try:
        with pytest.raises(RuntimeError, match=f"pid {neighbour.pid} .*serve-sim"):
            wait_ready(engine, 20.0)
    finally:
        stop(ours)
        stop(neighbour)


# A server that binds its port with SO_REUSEPORT, as vLLM's ``create_server_socket`` does: the kernel
# lets a second such socket of the same user bind and listen on the same port beside the first.
SHARED_PORT_SERVER = """
import http.server, json, socket, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(http.server.HTTPServer):
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def listens(pid: int, port: int) -> bool:
    try:
        sockets = listener.inet_sockets(psutil.Process(pid))
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in sockets)


@pytest.mark.timeout(60)
def test_a_neighbour_sharing_the_port_beside_the_arms_server_fails_the_start(tmp_path: Path) -> None:
    """vLLM binds with SO_REUSEPORT: a neighbour's vLLM of the same user on the same port binds beside
    ours, both listen, and the kernel spreads the arm's connections between them. Our own listener being
    there too does not make the arm's measurement its own server's."""
    port = free_port("127.0.0.1")
    command = [sys.executable, "-c", SHARED_PORT_SERVER, str(port)]
    with (tmp_path / "neighbour.log").open("wb") as out:
        neighbour = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    server = InferenceServer(command, f"http://127.0.0.1:{port}", tmp_path / "server.log", {}, "m")
    try:
        # while each runs, however long: the test's hard timeout bounds it (the finally stops both)
        while not listens(neighbour.pid, port):
            assert neighbour.poll() is None, "the neighbour ended unlistening"
            time.sleep(0.05)
        server.start()
        while not listens(server.process.pid, port):  # both listen before the first probe
            assert server.process.poll() is None, "ours ended unlistening"
            time.sleep(0.05)
        with pytest.raises(ServerStartError) as caught:
            server.wait_ready(["/health", "/v1/models"], 20.0)
    finally:
        server.stop(2.0)
        stop(neighbour)
    message = str(caught.value)
    assert f"pid {neighbour.pid}" in message and f"127.0.0.1:{port}" in message
    assert "SO_REUSEPORT" in message and "server.port" in message


def can_bind(host: str) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
        return True
    except OSError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("bind", "host"), [("127.0.0.1", "0.0.0.0"), ("::1", "::")])
def test_a_wildcard_host_reaches_a_server_on_loopback_and_it_is_its_own(
    tmp_path: Path, bind: str, host: str
) -> None:
    """``server.host: 0.0.0.0`` with a command that binds loopback (SGLang's default, or a command that
    does not pass ``{host}``): a connection to the wildcard address goes to loopback, so the probes reach
    our server, which the check took for a process 'this user cannot see'."""
    if not can_bind(bind):
        pytest.skip(f"this host cannot bind {bind}")
    port = free_port(bind)
    command = [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--host", bind, "--port", str(port)]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    server = InferenceServer([*command, "--model", "m"], url, tmp_path / "server.log", {}, "m")
    try:
        server.start()
        ready = server.wait_ready(["/health"], 30.0)
    finally:
        server.stop(5.0)
    owner = ready["listener"]
    assert owner["verified"] is True and owner["pid"] == server.process.pid
