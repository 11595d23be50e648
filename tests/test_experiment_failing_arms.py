"""Arms that fail or are stopped: a server that exits at once (the arms kept and reported), a declared GPU
checked first, a failed stage, SIGTERM to the runner, a receipt write that fails after an arm finished,
a signal during a resume's recovery; and a code workload's cgroup prepared before any arm."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from asyncroll.experiment.config import load_experiment_config
from tests.children import end
from tests.conftest import invoke
from tests.experiments import (
    CLI,
    ROOT,
    SMOKE,
    alive,
    kill_recorded,
    read,
    recorded_processes,
    wait_for_client,
    write_config,
)


@pytest.mark.timeout(90)
def test_failing_arms_are_kept_and_reported(tmp_path: Path) -> None:
    """A server that exits at once: every arm fails at its step, is kept, and the rest still run."""
    config = write_config(
        tmp_path,
        **{
            "server.command": ["{python}", "-c", "import sys; print('boom'); sys.exit(3)", "{port}"],
            "stages": {},
            "pairs": 1,
        },
    )
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 1, done.stdout + done.stderr
    assert "failed arms kept and reported: pair1-fifo, pair1-asyncroll" in done.stderr
    # the console shows the cause from the log tail, not only "…; log tail:"
    assert "[pair1-fifo] failed: server exited with code 3 before it was ready: boom" in done.stdout
    exp = read(out / "experiment.json")
    assert exp["status"] == "complete"
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        arm = read(out / "arms" / arm_id / "arm.json")
        assert arm["status"] == "failed" and arm["failed_step"] == "starting_server"
        assert "exited with code 3" in arm["error"] and "boom" in arm["error"]
        assert "client" not in arm
    comparison = read(out / "comparison.json")
    assert len(comparison["failed_arms"]) == 2 and comparison["pairs"][0]["complete"] is False
    # resume: nothing is retried
    again = invoke("experiment", "run", "--config", config, "--output", out, "--resume")
    assert again.exit_code == 1 and "0 unfinished arm(s)" in again.stdout
    assert read(out / "arms" / "pair1-fifo" / "arm.json") == read(out / "arms" / "pair1-fifo" / "arm.json")
    # a changed protocol refuses to resume, naming what changed
    changed = write_config(
        tmp_path,
        **{
            "server.command": ["{python}", "-c", "import sys; sys.exit(3)", "{port}"],
            "stages": {},
            "pairs": 1,
        },
    )
    refused = invoke("experiment", "run", "--config", changed, "--output", out, "--resume")
    assert refused.exit_code == 2 and "protocol changed" in refused.stderr and "config:" in refused.stderr
    # without --resume an existing experiment is never overwritten
    exists = invoke("experiment", "run", "--config", config, "--output", out)
    assert exists.exit_code == 2 and "--resume" in exists.stderr
    # the report of an experiment without a complete pair says unknown, and still draws the figure
    rep = invoke("report", "--comparison", out / "comparison.json", "--output", tmp_path / "r", "--figure")
    assert rep.exit_code == 0, rep.stderr
    text = (tmp_path / "r" / "REPORT.md").read_text()
    assert "unknown (no pair with a known value)" in text
    assert "- `pair1-fifo`: server exited with code 3 before it was ready: boom" in text


@pytest.mark.timeout(60)
def test_declared_gpu_is_checked_before_the_server_starts(tmp_path: Path) -> None:
    config = write_config(tmp_path, gpu={"index": 0, "name_contains": "H100"}, stages={}, pairs=1)
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    arm = read(out / "arms" / "pair1-fifo" / "arm.json")
    if arm["status"] == "failed":  # a machine without that idle GPU
        assert arm["failed_step"] == "checking_gpu" and "GPU 0" in arm["error"]
        assert "server" not in arm and done.exit_code == 1
    else:  # an idle H100 really is here
        assert arm["gpu"]["checked"] and "H100" in arm["gpu"]["name"]
    kill_recorded(out)


@pytest.mark.timeout(60)
def test_a_code_workload_s_runner_prepares_its_cgroup_before_any_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each arm's client (``asyncroll run``, the runner's child) prepares per-test cgroups; on cgroup v2
    it refused a domain that still held the runner (tests/test_cgroups_v2.py), so the runner prepares
    first, before any arm. The arm then fails at its GPU check here (none declared is idle)."""
    from asyncroll.evaluator import cgroups_v2

    out = tmp_path / "out"
    calls: list[bool] = []
    monkeypatch.setattr(cgroups_v2, "prepare_for_children", lambda: calls.append((out / "arms").exists()))
    code = ROOT / "examples" / "livecodebench" / "workload.jsonl"
    changes: dict[str, object] = {"workload.path": str(code), "workload.sha256": None, "client.replay": False}
    changes["client.extra_args"] = ["--allow-weak-isolation"]  # a non-root machine's sandbox passes too
    config = write_config(tmp_path, gpu={"index": 0, "name_contains": "H100"}, stages={}, pairs=1, **changes)
    invoke("experiment", "run", "--config", config, "--output", out)
    kill_recorded(out)
    assert calls == [False]  # once, before any arm existed
    assert (out / "arms" / "pair1-fifo" / "arm.json").exists()
    calls.clear()
    smoke = write_config(tmp_path, gpu={"index": 0, "name_contains": "H100"}, stages={}, pairs=1)
    invoke("experiment", "run", "--config", smoke, "--output", tmp_path / "o2")
    kill_recorded(tmp_path / "o2")
    assert calls == []  # no code to isolate: the runner's cgroup is left as it is


@pytest.mark.timeout(60)
def test_sigterm_stops_the_arm_cleanly(tmp_path: Path) -> None:
    """A second runner on the directory is refused while the first runs; then SIGTERM to the runner: the
    client and the server's group are stopped, the arm is interrupted."""
    from asyncroll.errors import UsageError
    from asyncroll.experiment.runner import ExperimentRunner

    command = json.loads(SMOKE.read_text())["server"]["command"]
    command[command.index("--step-base-ms") + 1] = "150"  # a client that runs long enough to be refused
    config = write_config(tmp_path, stages={}, pairs=1, **{"server.command": command})
    out = tmp_path / "out"
    log = (tmp_path / "runner.log").open("wb")
    runner = subprocess.Popen(
        [*CLI, "experiment", "run", "--config", str(config), "--output", str(out)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    arm_json = out / "arms" / "pair1-fifo" / "arm.json"
    try:
        wait_for_client(runner, arm_json, tmp_path / "runner.log", 40)  # its client spawned and recorded
        live = read(arm_json)
        # a --resume (or a new run) on a directory a live runner uses is refused; nothing is touched
        for resume in (True, False):
            second = ExperimentRunner(load_experiment_config(config), out, resume=resume, echo=lambda _: None)
            with pytest.raises(UsageError, match=f"being run by pid {runner.pid} "):
                second.run()
        assert read(arm_json)["status"] == "running_client" and not list(out.glob("arms/*.interrupted-*"))
        assert all(alive(p) for p in (live["server"]["process"], live["client"]["process"]))
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(40) == 130
    finally:
        try:
            end(runner)
        finally:
            kill_recorded(out)
    arm = read(arm_json)
    assert arm["status"] == "interrupted" and arm["error"] == "interrupted while running_client"
    assert arm["server"]["stop"]["leftover"] == [] and "stop" in arm["client"]
    assert not any(alive(p) for p in recorded_processes(out))
    exp = read(out / "experiment.json")
    assert exp["status"] == "interrupted" and exp["arms"]["pair1-fifo"]["status"] == "interrupted"
    assert exp["arms"]["pair1-asyncroll"]["status"] == "pending"
    assert exp["stop_reason"] == "interrupted by SIGTERM"  # REPORT.md says why, not only "interrupted"
    assert read(out / "comparison.json")["stop_reason"] == "interrupted by SIGTERM"
    assert "resume with --resume" in (tmp_path / "runner.log").read_text()


@pytest.mark.timeout(60)
def test_a_failed_stage_stops_the_experiment_before_the_comparison(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        **{
            "server.command": ["{python}", "-c", "import sys; sys.exit(4)", "{port}"],
            "stages": {"qualification": {"arms": ["fifo"], "gates": []}},
        },
    )
    out = tmp_path / "out"
    done = invoke("experiment", "run", "--config", config, "--output", out)
    assert done.exit_code == 1 and "stage qualification failed its gate" in done.stderr
    exp = read(out / "experiment.json")
    assert exp["status"] == "stopped" and exp["stages"]["qualification"]["status"] == "failed"
    assert exp["stages"]["qualification"]["failed_arms"] == ["qualification-1-fifo"]
    assert exp["stages"]["comparison"]["status"] == "pending"
    assert {k for k, v in exp["arms"].items() if v["status"] != "pending"} == {"qualification-1-fifo"}
    assert not (out / "arms" / "pair1-fifo").exists()
    again = invoke("experiment", "run", "--config", config, "--output", out, "--resume")
    assert again.exit_code == 1 and "stopped earlier at qualification" in again.stderr
    # the resume keeps why it stopped (REPORT.md's status line), not only that it had stopped before
    assert "stage qualification failed its gate" in read(out / "experiment.json")["stop_reason"]


@pytest.mark.timeout(240)
def test_a_receipt_write_that_fails_after_an_arm_finished_never_loses_the_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk for a moment: one receipt write fails (OSError ENOSPC, injected once) after the arm's
    client finished and its outputs passed the checks — first the arm.json of its server's stop, then,
    in a second experiment, the experiment.json that records it complete. The arm stayed failed for
    ever (a resume never looked again). Now the measurement stands: the arm is complete, the experiment
    stops with the error (exit 1, no traceback), and --resume finishes the rest."""
    import errno

    import asyncroll.experiment.receipts as receipts
    from asyncroll.experiment.config import load_experiment_config
    from asyncroll.experiment.runner import ExperimentRunner

    config = write_config(tmp_path, pairs=1, stages={})
    cfg = load_experiment_config(config)
    real = receipts.write_json_atomic
    for when in ("stopping_server", "recorded complete"):
        out = tmp_path / when.replace(" ", "-")
        fired: list[Path] = []

        def once(path: Path, data: dict[str, Any], when: str = when, fired: list[Path] = fired) -> None:
            hit = (
                path.name == "arm.json" and data.get("status") == "stopping_server"
                if when == "stopping_server"
                else path.name == "experiment.json"
                and any(a["status"] == "complete" for a in data["arms"].values())
            )
            if hit and not fired:
                fired.append(path)
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            real(path, data)

        monkeypatch.setattr(receipts, "write_json_atomic", once)
        try:
            outcome = ExperimentRunner(cfg, out, config_path=config, echo=lambda _: None).run()
        finally:
            kill_recorded(out)
        monkeypatch.setattr(receipts, "write_json_atomic", real)
        assert fired, when
        assert (outcome.status, outcome.exit_code) == ("failed", 1), outcome.message
        assert "No space left on device" in outcome.message
        first = read(out / "experiment.json")["arms"]["pair1-fifo"]
        assert first["status"] == "complete", (when, first)
        assert read(out / "arms" / "pair1-fifo" / "arm.json")["status"] == "complete"
        resumed = invoke("experiment", "run", "--config", config, "--output", out, "--resume")
        assert resumed.exit_code == 0, resumed.stdout + resumed.stderr
        arms = read(out / "experiment.json")["arms"]
        assert {k: v["status"] for k, v in arms.items()} == {
            "pair1-fifo": "complete",
            "pair1-asyncroll": "complete",
        }
        assert not [p for p in recorded_processes(out) if alive(p)]


def test_a_signal_during_a_resumes_recovery_waits_for_it_then_interrupts() -> None:
    """A Ctrl-C while --resume killed the dead runner's server (a GPU held) cut the sweep short and left
    it running; the guard now records it and interrupts once the recovery is done."""
    from asyncroll.experiment.arms import ExperimentInterrupted
    from asyncroll.experiment.signals import SignalGuard

    with SignalGuard() as guard:
        with guard.deferred():
            signal.raise_signal(signal.SIGINT)  # recorded, not raised: the recovery goes on
            recovered = True
        assert recovered and guard.received == "SIGINT"
        with pytest.raises(ExperimentInterrupted, match="SIGINT"):
            guard.raise_deferred()
        guard.raise_deferred()  # once
        signal.raise_signal(signal.SIGTERM)  # a later signal is counted, as before
        assert guard.ignored == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("role", ["server", "client"])
def test_an_arm_process_killed_by_a_signal_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """A client (or a server) killed outright (the OOM killer, kill -9) before it wrote a word: the arm
    said 'client exited with code -9; log tail:' and nothing after it, where a server that died while the
    client ran was said to be 'killed by SIGKILL'. Both now name the signal, and an empty log as such."""
    import asyncroll.experiment.arms as arms_module
    from tests.lean_experiment import lean, one_arm, ready_server

    suicide = ["sh", "-c", "kill -9 $$"]
    server = ready_server(tmp_path)
    if role == "server":
        server["command"] = [*suicide, "{port}"]
    monkeypatch.setattr(arms_module, "client_command", lambda *_args: suicide)
    arm = one_arm(lean(tmp_path, server=server), tmp_path / "out")
    assert arm["status"] == "failed", arm
    said = f"{role} was killed by SIGKILL (exit code -9)"
    assert arm["error"].startswith(said) and arm["error"].endswith("log tail:\n(empty log)"), arm["error"]
