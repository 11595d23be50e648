"""Signals reaching the experiment runner (Ctrl-C, SIGTERM, SIGHUP), also while it stops an arm's
processes: the server is always stopped, the arm ends interrupted or stays complete."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import ManagedProcess
from tests.experiments import alive, kill_recorded, read, recorded_processes
from tests.lean_experiment import is_client, lean


@pytest.mark.timeout(90)
def test_signals_during_cleanup_never_leave_the_server_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the client runs, then another Ctrl-C and a SIGTERM while it is being stopped: the
    further signals are ignored, the server is stopped all the same, the arm ends interrupted."""
    real_wait, real_stop = ManagedProcess.wait, ManagedProcess.stop
    waits: list[float] = []

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        if is_client(self) and not waits:  # the runner's wait for the client, not stop()'s
            waits.append(timeout)
            os.kill(os.getpid(), signal.SIGINT)
        return real_wait(self, timeout)

    def stop(self: ManagedProcess, grace_s: float) -> dict[str, Any]:
        if is_client(self):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_stop(self, grace_s)

    monkeypatch.setattr(ManagedProcess, "wait", wait)
    monkeypatch.setattr(ManagedProcess, "stop", stop)
    out = tmp_path / "out"
    previous = signal.getsignal(signal.SIGINT)
    try:
        outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
        left_running = [p for p in recorded_processes(out) if alive(p)]  # before the test's own cleanup
    finally:
        kill_recorded(out)
    assert recorded_processes(out) and left_running == []
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert arm["status"] == "interrupted" and arm["error"] == "interrupted while running_client"
    assert "stop" in arm["client"] and arm["server"]["stop"]["leftover"] == []
    assert signal.getsignal(signal.SIGINT) is previous  # the runner's handlers are gone
    assert outcome.exit_code == 130 and "2 more signal(s) ignored while stopping" in outcome.message
    experiment = read(out / "experiment.json")
    assert experiment["status"] == "interrupted"
    # the stage the interrupt cut is not left "running" (the report's stage table shows it)
    assert experiment["stages"]["comparison"]["status"] == "interrupted"


@pytest.mark.timeout(120)
def test_an_interrupt_while_the_server_stops_keeps_the_finished_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the server of an arm whose client finished is being stopped: the server is stopped
    all the same, the arm stays complete in arm.json and experiment.json, and --resume does not run it
    again, even when the runner died before experiment.json recorded it."""
    from asyncroll.experiment.server import InferenceServer

    real_stop = InferenceServer.stop
    calls: list[float] = []

    def stop(self: InferenceServer, grace_s: float) -> dict[str, Any]:
        calls.append(grace_s)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real_stop(self, grace_s)

    monkeypatch.setattr(InferenceServer, "stop", stop)
    cfg, out = lean(tmp_path), tmp_path / "out"
    try:
        outcome = ExperimentRunner(cfg, out, echo=lambda _: None).run()
        left_running = [p for p in recorded_processes(out) if alive(p)]
    finally:
        kill_recorded(out)
    assert outcome.exit_code == 130 and len(calls) == 2 and left_running == []
    arm_json = out / "arms" / "pair1-fifo" / "arm.json"
    arm = read(arm_json)
    assert arm["status"] == "complete" and arm["error"] is None and arm["summary_status"] == "complete"
    assert arm["interrupted_while"] == "stopping_server" and arm["server"]["stop"]["leftover"] == []
    exp = read(out / "experiment.json")
    assert exp["status"] == "interrupted" and exp["arms"]["pair1-fifo"]["status"] == "complete"
    assert exp["arms"]["pair1-asyncroll"]["status"] == "pending"
    # a runner killed between the arm's end and its record in experiment.json
    exp["arms"]["pair1-fifo"]["status"] = "running"
    (out / "experiment.json").write_text(json.dumps(exp))
    monkeypatch.undo()
    lines: list[str] = []
    try:
        outcome = ExperimentRunner(cfg, out, resume=True, echo=lines.append).run()
    finally:
        kill_recorded(out)
    assert outcome.status == "complete" and outcome.exit_code == 0, lines
    assert not list(out.glob("arms/*.interrupted-*")) and read(arm_json) == arm  # not run again
    exp = read(out / "experiment.json")
    assert {a["status"] for a in exp["arms"].values()} == {"complete"}
    assert exp["resumes"][-1]["finished_arms_recorded"] == ["pair1-fifo"]


@pytest.mark.timeout(60)
def test_sighup_is_handled_like_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed terminal or ssh session (SIGHUP) stops the arm's client and server and marks it
    interrupted; it never leaves experiment.json running."""

    class Unhandled(Exception):
        pass

    def unhandled(_signum: int, _frame: Any) -> None:
        raise Unhandled("SIGHUP reached the runner unhandled")

    real_wait = ManagedProcess.wait
    sent: list[bool] = []

    def wait(self: ManagedProcess, timeout: float) -> int | None:
        if is_client(self) and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGHUP)
        return real_wait(self, timeout)

    monkeypatch.setattr(ManagedProcess, "wait", wait)
    previous = signal.signal(signal.SIGHUP, unhandled)  # without the guard: an error, not a dead pytest
    out = tmp_path / "out"
    try:
        outcome = ExperimentRunner(lean(tmp_path), out, echo=lambda _: None).run()
        left_running = [p for p in recorded_processes(out) if alive(p)]
        assert signal.getsignal(signal.SIGHUP) is unhandled  # the runner's handler is gone
    finally:
        signal.signal(signal.SIGHUP, previous)
        kill_recorded(out)
    assert outcome.exit_code == 130 and "interrupted by SIGHUP" in outcome.message
    assert left_running == [] and recorded_processes(out)
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert arm["status"] == "interrupted" and arm["error"] == "interrupted while running_client"
    assert read(out / "experiment.json")["status"] == "interrupted"
