"""One real lean experiment, shared by its tests: started under nohup and hung up mid-arm (it survives),
its server detaching a helper (killed and reported), and resumes of its damaged output."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from asyncroll.experiment.config import ExperimentConfig, load_experiment_config
from asyncroll.experiment.runner import ExperimentRunner
from tests.children import end
from tests.experiments import ROOT, kill_recorded, read, wait_for_client, write_config


@dataclass(frozen=True)
class Finished:
    cfg: ExperimentConfig
    out: Path
    said: str  # the runner's output
    exit_code: int
    marker: str  # the command line of the helper the server detaches
    left: list[int]  # those helpers still running after the experiment ended


def detached_helpers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.info["cmdline"] or []) == marker:
                found.append(proc)
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    """A lean experiment run to its end, shared by the tests below (one experiment, three stories):
    started as ``nohup asyncroll experiment run … &`` and hung up while its first arm's client runs;
    its server detaches a helper (``setsid -f``) at start; the resume tests copy and damage its output."""
    if shutil.which("nohup") is None or shutil.which("setsid") is None:
        pytest.skip("needs nohup and setsid")
    from tests.experiments import SMOKE

    tmp = tmp_path_factory.mktemp("finished")
    marker = f"sleep 77{os.getpid() % 10}.5"
    serve = json.loads(SMOKE.read_text())["server"]["command"]
    server = ["bash", "-c", f'setsid -f {marker}; exec "$0" "$@"', *serve]
    config = write_config(tmp, stages={}, pairs=1, **{"server.command": server})
    out, log_path = tmp / "out", tmp / "runner.log"
    command = ["nohup", sys.executable, "-m", "asyncroll.cli", "experiment", "run"]
    with log_path.open("wb") as log:
        runner = subprocess.Popen(
            [*command, "--config", str(config), "--output", str(out)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:  # the hangup comes while the first arm's client runs
        wait_for_client(runner, out / "arms" / "pair1-fifo" / "arm.json", log_path)
        runner.send_signal(signal.SIGHUP)
        code = runner.wait(120)
        left = [p.pid for p in detached_helpers(marker) if p.status() != psutil.STATUS_ZOMBIE]
        yield Finished(load_experiment_config(config), out, log_path.read_text(), code, marker, left)
    finally:
        try:
            end(runner)
        finally:
            kill_recorded(out)
        for proc in detached_helpers(marker):
            with contextlib.suppress(psutil.Error):
                proc.kill()


@pytest.mark.timeout(150)
def test_a_runner_started_under_nohup_survives_the_hangup(finished: Finished) -> None:
    """``nohup asyncroll experiment run … &`` and log out: the hangup reached the runner, whose handler
    had replaced nohup's SIG_IGN, and interrupted the experiment overnight. It now stays ignored."""
    assert finished.exit_code == 0 and "interrupted" not in finished.said, finished.said
    exp = read(finished.out / "experiment.json")
    assert exp["status"] == "complete"
    assert {arm["status"] for arm in exp["arms"].values()} == {"complete"}


@pytest.mark.timeout(150)
def test_a_process_the_server_detaches_is_killed_and_reported(finished: Finished) -> None:
    """A server that detaches a helper (``setsid -f``): the runner adopts it, kills it when the arm's
    server stops, and arm.json names it in ``leftover`` and ``orphans``, never ``leftover: []``."""
    assert finished.exit_code == 0, finished.said
    assert finished.left == []
    for arm_id in ("pair1-fifo", "pair1-asyncroll"):
        stop = read(finished.out / "arms" / arm_id / "arm.json")["server"]["stop"]
        assert len(stop["orphans"]) == 1 and stop["orphans"][0]["command"] == finished.marker, stop
        assert stop["orphans"][0]["killed"] and stop["leftover"] == [stop["orphans"][0]["pid"]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("damage", "error"),
    [
        # "unexpected error: ValidationError: … SummaryModel cpu_cost Field required", naming no file, and
        # "(not recorded …)" although experiment.json had recorded it
        ("field", "not a summary.json this asyncroll reads: cpu_cost: Field required"),
        # the arm's metrics all became "not measured", the experiment "complete" (exit 0), nothing said
        ("file", "not found, though the arm completed (its arm.json): restore the file"),
    ],
)
def test_a_resume_names_the_arms_summary_json_it_cannot_read(
    finished: Finished, tmp_path: Path, damage: str, error: str
) -> None:
    cfg, out = finished.cfg, tmp_path / "out"
    shutil.copytree(finished.out, out)
    summary = out / "arms" / "pair1-fifo" / "run" / "summary.json"
    if damage == "field":
        data = read(summary)
        del data["cpu_cost"]
        summary.write_text(json.dumps(data))
    else:
        summary.unlink()
    (out / "comparison.json").unlink()
    outcome = ExperimentRunner(cfg, out, resume=True, echo=lambda _: None).run()
    error = f"{summary}: {error}"
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.message.startswith(f"experiment failed: {error} (comparison.json not written); see ")
    exp = read(out / "experiment.json")
    assert exp["status"] == "failed" and exp["error"] == error
