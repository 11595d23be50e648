"""What an arm's client detaches is recorded as the client's, not the server's; a helper that cleared its
environment is killed and listed apart."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import asyncroll.experiment.arms as arms_module
from asyncroll.experiment.server import ManagedProcess
from tests.lean_experiment import lean, one_arm, ready_server


@pytest.fixture
def subreaper() -> Iterator[None]:
    """The test process adopts orphans while the test runs, as the runner does (ExperimentRunner.run)."""
    from asyncroll.proctree import is_subreaper, set_subreaper

    before = is_subreaper()
    set_subreaper(True)
    yield
    if not before:
        set_subreaper(False)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ends", ["exits", "stopped"])
def test_what_the_client_detaches_is_recorded_as_the_clients_not_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subreaper: None, ends: str
) -> None:
    """The client detaches a helper (setsid -f), then exits or is stopped at its deadline, while the
    helper lives on: the client's stop kills it and lists it, the server's stop lists only what the
    server left. A helper that cleared its environment cannot be attributed: killed, and listed apart."""
    import time

    import psutil

    mine, anonymous = (f"sleep {600 + os.getpid() % 1000}.{n}" for n in (25, 75))
    then = "exit 0" if ends == "exits" else "sleep 30"
    script = f"setsid -f {mine}; env -i setsid -f {anonymous}; {then}"
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: ["bash", "-c", script])
    cfg = lean(
        tmp_path, server=ready_server(tmp_path), **{"client.deadline_s": 30 if ends == "exits" else 0.3}
    )

    def helpers() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if " ".join(proc.info["cmdline"] or []) in (mine, anonymous):
                    found.append(proc)
        return found

    real_wait = ManagedProcess.wait

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        """The runner waits for the client once both helpers run (they fork and exec on their own time)."""
        end = time.monotonic() + 10
        while self.role == "client" and len(helpers()) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        return real_wait(self, timeout)

    monkeypatch.setattr(ManagedProcess, "wait", wait)
    try:
        arm = one_arm(cfg, tmp_path / "out")
        left = [p.pid for p in helpers() if p.status() != psutil.STATUS_ZOMBIE]
    finally:
        for proc in helpers():
            with contextlib.suppress(psutil.Error):
                proc.kill()
    assert left == []
    client_stop, server_stop = arm["client"]["stop"], arm["server"]["stop"]
    assert client_stop["how"] == ("exited" if ends == "exits" else "term")
    assert [o["command"] for o in client_stop.get("orphans", [])] == [mine], client_stop
    assert client_stop["orphans"][0]["killed"] and client_stop["orphans"][0]["origin"].startswith("client:")
    assert client_stop["leftover"] == [client_stop["orphans"][0]["pid"]]
    assert "orphans" not in server_stop and server_stop["leftover"] == [], server_stop
    assert [o["command"] for o in arm["unattributed_orphans"]] == [anonymous]
    assert arm["unattributed_orphans"][0]["killed"] and "origin" not in arm["unattributed_orphans"][0]
