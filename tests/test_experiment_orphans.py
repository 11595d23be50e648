"""What a killed runner's server left running, a resume kills: its group and tree, and what it detached."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import asyncroll.experiment.runner as runner_module
from asyncroll.errors import UsageError
from asyncroll.experiment.arms import ExperimentInterrupted
from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import ManagedProcess
from tests.experiments import read
from tests.lean_experiment import lean
from tests.test_experiment_setup import fake_arms


def _kill_all(marker: str, leader: ManagedProcess) -> None:
    """A test's clean-up: every live process of ``marker``, and ``leader``'s process group."""
    for proc in running(marker):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(10)


def running(marker: str) -> list[psutil.Process]:
    """Live processes whose command line is ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.info["cmdline"] or []) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


@pytest.mark.timeout(60)
def test_a_resume_kills_what_the_dead_runners_server_had_detached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that detaches a helper (``setsid -f``: a new session, out of the server's group and
    tree) while the runner is killed: the helper was re-parented away from the runner, and the resume's
    sweep, which killed only the recorded group and tree, left it running (holding the GPU, say). The
    helper carries the server's recorded origin, so the sweep now finds and kills it, and says so."""
    marker = f"sleep 88{os.getpid() % 10}.5"
    server = ManagedProcess(
        ["bash", "-c", f"setsid -f {marker}; exec sleep 60"], tmp_path / "server.log", role="server"
    )

    def killed_runner(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        """The arm's server starts and detaches its helper, then the runner is gone (as after SIGKILL)."""
        arm_dir.mkdir(parents=True)
        server.start()
        end = time.monotonic() + 20
        while not running(marker):
            assert time.monotonic() < end, server.log.read_text()
            time.sleep(0.02)
        arm = {"status": "running_client", "server": {"process": server.record()}}
        (arm_dir / "arm.json").write_text(json.dumps(arm))
        raise ExperimentInterrupted("SIGKILL")

    cfg = lean(tmp_path)
    out = tmp_path / "out"
    calls: list[str] = []
    try:
        monkeypatch.setattr(runner_module, "run_arm", killed_runner)
        assert ExperimentRunner(cfg, out, echo=lambda _: None).run().status == "interrupted"
        helper = running(marker)
        assert len(helper) == 1 and helper[0].ppid() != server.pid
        assert os.getpgid(helper[0].pid) != server.pid  # out of the server's group and tree
        monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
        outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
        left = running(marker)
    finally:
        _kill_all(marker, server)
    assert outcome.status == "complete" and calls == ["pair1-fifo", "pair1-asyncroll"], outcome.message
    assert left == []
    swept = read(out / "experiment.json")["arms"]["pair1-fifo"]["attempts_interrupted"][0]["orphans"]
    assert swept["server"] == f"killed; killed what carried its origin: pid {helper[0].pid} ({marker})", swept


@pytest.mark.timeout(60)
@pytest.mark.parametrize("role", ["server", "client"])
def test_a_signal_while_a_process_is_spawned_still_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """Ctrl-C can land inside ``subprocess.Popen`` after the fork, while it waits for the exec: the child
    runs, but no Popen object is returned. The arm's stop took such a server for one never spawned and
    left it running after the runner exited (holding the GPU); now each stop finds its process by the
    origin it carries, and the arm ends interrupted."""
    import subprocess

    import asyncroll.experiment.arms as arms_module
    from tests.lean_experiment import one_arm, ready_server

    real = subprocess.Popen
    spawned: list[Any] = []  # held here: a Popen dropped while its child runs warns

    def cut(command: list[str], *args: Any, **kwargs: Any) -> Any:
        process = real(command, *args, **kwargs)
        if "cut-here" in command:  # the signal arrives after the fork, before Popen returns
            spawned.append(process)
            raise ExperimentInterrupted("SIGINT")
        return process

    server = ready_server(tmp_path)
    client = ["sleep", "30"]
    if role == "server":  # sh runs the server as it is ($0 is the marker)
        server["command"] = ["sh", "-c", 'exec "$@"', "cut-here", *server["command"]]
    else:
        client = ["sh", "-c", "sleep 30", "cut-here"]
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: client)
    monkeypatch.setattr(subprocess, "Popen", cut)
    out = tmp_path / "out"
    try:
        with pytest.raises(ExperimentInterrupted):
            one_arm(lean(tmp_path, server=server), out)
    finally:
        monkeypatch.undo()
    assert len(spawned) == 1
    pid = spawned[0].pid
    try:
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        alive = False
    if alive:
        os.killpg(pid, signal.SIGKILL)
    spawned[0].wait(10)
    assert not alive, f"the {role} whose spawn was cut short still runs"
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    assert arm["status"] == "interrupted"
    if role == "client":
        stop = arm["client"]["stop"]
        assert [o["pid"] for o in stop["orphans"]] == [pid], arm


@pytest.mark.timeout(30)
def test_the_sweep_never_kills_the_group_of_a_process_that_reuses_a_recorded_pid(tmp_path: Path) -> None:
    """After a reboot (or once pids wrapped), a recorded server pid can be another process's, leading its
    own process group: the sweep saw the leader was not the recorded one and still SIGKILLed that group
    id, killing an unrelated process group (a daemon's, another user's job; as root, anything). Now a
    gone leader's group is left alone; what outlived it in its group carries its origin and is killed."""
    from asyncroll.experiment.orphans import sweep_orphan

    marker = f"sleep 99{os.getpid() % 10}.5"
    # our server: the leader exits, a member of its group outlives it (re-parented away from us)
    ours = ManagedProcess(["sh", "-c", f"{marker} & sleep 0.3"], tmp_path / "server.log", role="server")
    ours.start()
    record = ours.record()
    # somebody else's process group, whose leader has the pid a dead runner recorded (another start time)
    innocent = ManagedProcess(["sh", "-c", "sleep 1000 & exec sleep 1001"], tmp_path / "other.log")
    innocent.start()
    try:
        assert ours.wait(10) == 0 and running(marker)
        # a dead runner's record of a server started an hour before: its pid is the innocent leader's now
        earlier = record["create_time"] - 3600
        reused = {"pid": innocent.pid, "pgid": innocent.pid, "create_time": earlier, "origin": "server:0"}
        assert sweep_orphan(reused) == "gone"
        assert sweep_orphan({**reused, "create_time": None}) == "gone"  # nothing proves it is ours
        for pid in ("twelve", 12.0, True, -1):  # a hand-edited arm.json: said, never a traceback or a kill
            assert sweep_orphan({**reused, "pid": pid}) == f"pid not readable ({str(pid)!r})"
        assert innocent.poll() is None and len(psutil.Process(innocent.pid).children()) == 1
        member = running(marker)[0].pid
        said = sweep_orphan(record)
        assert said == f"gone; killed what carried its origin: pid {member} ({marker})", said
        assert running(marker) == []
    finally:
        _kill_all(marker, innocent)


@pytest.mark.timeout(60)
def test_a_process_looked_at_while_it_execs_still_carries_its_origin() -> None:
    """A process shows an empty environment for a moment while it execs (just spawned, or a shell exec'ing
    the server it wraps): read right after its spawn, one time in six it carried no origin, so a stop that
    came then (a Ctrl-C cut its spawn short) did not find it and left it running, holding the GPU. The
    flaky ``test_a_signal_while_a_process_is_spawned_still_stops_it[client]`` was this."""
    import subprocess

    from asyncroll.experiment.orphans import ORIGIN_ENV, origin_of

    env = {**os.environ, ORIGIN_ENV: "server:0"}
    missed = 0
    for _ in range(40):
        proc = subprocess.Popen(["sh", "-c", "sleep 30", "origin-test"], env=env, start_new_session=True)
        try:
            missed += origin_of(proc.pid) != "server:0"  # at once: its exec may still be under way
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the shell and its sleep (forked, where it does not exec)
            proc.wait(10)
    assert missed == 0


#: The runner in a subprocess, SIGKILLed (as by ``kill -9`` or the OOM killer) right after it spawned
#: the arm's process of ``role`` and before its receipt recorded that process.
_KILLED_AFTER_SPAWN = """
import os, signal, sys
from pathlib import Path
import asyncroll.experiment.arms as arms
from asyncroll.experiment.config import load_experiment_config
from asyncroll.experiment.runner import ExperimentRunner
from asyncroll.experiment.server import ManagedProcess

config, out, role, client = sys.argv[1:5]
real = ManagedProcess.record
def record(self):
    if self.role == role:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self)
ManagedProcess.record = record
arms.client_command = lambda *_args: client.split()
ExperimentRunner(load_experiment_config(Path(config)), Path(out), echo=print).run()
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("role", ["server", "client"])
def test_a_resume_kills_what_a_runner_killed_before_recording_its_spawn_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """A runner killed (``kill -9``) after it spawned an arm's server, or its client, and before its
    receipt recorded the process: the receipt had no pid, the resume's sweep said "none recorded" and
    the process ran on (a server holding the GPU; a client writing into the arm's directory, where the
    resume's own attempt of the arm runs). Its origin is now recorded before the spawn, and the sweep
    kills what carries it."""
    import subprocess
    import sys

    from tests.experiments import write_config
    from tests.lean_experiment import ready_server

    marker = f"sleep 66{os.getpid() % 10}.5"
    server = ready_server(tmp_path)
    if role == "server":  # never ready; the runner is killed before it polls
        server["command"] = ["sh", "-c", f"exec {marker}", "{port}"]
    config = write_config(tmp_path, stages={}, pairs=1, server=server)
    out = tmp_path / "out"
    calls: list[str] = []
    try:
        child = subprocess.run(
            [sys.executable, "-c", _KILLED_AFTER_SPAWN, str(config), str(out), role, marker],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
        assert len(running(marker)) == 1  # left running by the dead runner, recorded nowhere but its origin
        monkeypatch.setattr(runner_module, "run_arm", fake_arms(calls))
        from asyncroll.experiment.config import load_experiment_config

        outcome = ExperimentRunner(
            load_experiment_config(config), out, resume=True, echo=lambda _: None
        ).run()
        left = running(marker)
    finally:
        for proc in running(marker):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        from tests.experiments import kill_recorded

        kill_recorded(out)
    assert left == [], f"the dead runner's {role} still runs after the resume"
    assert outcome.status == "complete" and calls == ["pair1-fifo", "pair1-asyncroll"], outcome.message
    swept = read(out / "experiment.json")["arms"]["pair1-fifo"]["attempts_interrupted"][0]["orphans"]
    assert swept[role].startswith("no pid recorded; killed what carried its origin: pid "), swept


@pytest.mark.timeout(30)
def test_a_wall_clock_step_before_the_resume_still_finds_the_recorded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil's create_time is the boot time in wall-clock seconds plus the process's start since boot,
    so NTP stepping the clock an hour between the runner's record and the resume moved it an hour: the
    recorded server read as another process ("gone"), its tree was not killed, and a descendant that
    carries no origin (it cleared its environment) was left running. The record's start mark is on the
    kernel's boot clock, which no step moves."""
    import psutil._pslinux as pslinux

    from asyncroll.experiment.orphans import sweep_orphan

    marker = f"sleep 98{os.getpid() % 10}.5"
    server = ManagedProcess(["sh", "-c", f"env -i {marker} & exec sleep 1003"], tmp_path / "s.log")
    server.start()
    try:
        deadline = time.monotonic() + 20
        while not running(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running(marker), "the descendant never started: its end below would prove nothing"
        record = server.record()
        stepped = pslinux.boot_time() + 3600.0  # /proc/stat's btime after the clock stepped an hour on
        monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
        # psutil before 6 keeps the boot time it read first (BOOT_TIME): stepped too
        monkeypatch.setattr(pslinux, "BOOT_TIME", stepped, raising=False)
        assert sweep_orphan(json.loads(json.dumps(record)), grace_s=2.0) == "killed"
        assert server.wait(10) is not None
        deadline = time.monotonic() + 5
        while running(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running(marker) == []  # the descendant that carried no origin went with the tree
    finally:
        _kill_all(marker, server)


def _refused_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changed: Any, odd_arm: dict[str, Any] | None = None
) -> str:
    """A runner killed while its first arm's server ran (``odd_arm``: the second arm's arm.json then), and
    a resume under the ``changed`` config: the refusal's message (it names the server; nothing is killed)."""
    server = ManagedProcess(["sleep", "60"], tmp_path / "server.log", role="server")

    def killed_runner(cfg: Any, plan: Any, arm_dir: Path, *args: Any, **kwargs: Any) -> Any:
        arm_dir.mkdir(parents=True)
        server.start()
        arm = {"status": "running_client", "server": {"process": server.record()}, "client": None}
        (arm_dir / "arm.json").write_text(json.dumps(arm))
        if odd_arm is not None:
            odd = arm_dir.with_name("pair1-asyncroll")
            odd.mkdir()
            (odd / "arm.json").write_text(json.dumps(odd_arm))
        raise ExperimentInterrupted("SIGKILL")

    try:
        monkeypatch.setattr(runner_module, "run_arm", killed_runner)
        assert ExperimentRunner(lean(tmp_path), tmp_path / "out", echo=lambda _: None).run().status == (
            "interrupted"
        )
        with pytest.raises(UsageError) as refused:
            ExperimentRunner(changed, tmp_path / "out", resume=True, echo=lambda _: None).run()
        assert server.poll() is None  # refused: nothing killed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    message = str(refused.value)
    assert f"pid {server.pid} (pair1-fifo's server, process group {server.pid})" in message, message
    assert f"(kill -- -{server.pid})" in message
    return message


@pytest.mark.timeout(60)
def test_a_refused_resume_names_what_its_dead_runner_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume refused for a changed protocol kills nothing (it touches nothing), but the dead runner's
    server still runs (holding the GPU, say) and the refusal sends the user to a new experiment, whose
    arms would meet it: the refusal names it, with how to stop it."""
    message = _refused_resume(tmp_path, monkeypatch, lean(tmp_path, description="edited"))
    assert "the protocol changed" in message


@pytest.mark.timeout(60)
def test_a_resume_refused_for_a_changed_plan_names_the_server_of_an_arm_the_new_plan_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dead runner's arm was renamed in the config (the protocol changed): its server still runs, and
    the refusal names it (it looked only in the new plan's arm folders, so said nothing). An arm.json with
    a non-object where an object is expected is passed over, not a traceback in place of the refusal."""
    arms = [{"name": "fcfs", "policy": "fifo"}, {"name": "asyncroll", "policy": "asyncroll"}]
    changed = lean(tmp_path, arms=arms, baseline="fcfs")
    odd = {"status": "starting_server", "server": {"process": 7}}
    message = _refused_resume(tmp_path, monkeypatch, changed, odd_arm=odd)
    assert "changed" in message
