"""The runner's stop signals as a researcher sends them: a runner started under ``nohup`` survives the
terminal's hangup (SIGHUP) and finishes; SIGTERM still stops it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_experiment import ROOT, kill_recorded, read, write_config


@pytest.mark.timeout(150)
@pytest.mark.skipif(shutil.which("nohup") is None, reason="needs nohup")
def test_a_runner_started_under_nohup_survives_the_hangup(tmp_path: Path) -> None:
    """``nohup asyncroll experiment run … &`` and log out: the hangup reached the runner, whose handler
    had replaced nohup's SIG_IGN, and interrupted the experiment overnight. It now stays ignored."""
    config = write_config(tmp_path, stages={}, pairs=1)
    out = tmp_path / "out"
    log = (tmp_path / "runner.log").open("wb")
    command = ["nohup", sys.executable, "-m", "asyncroll.cli", "experiment", "run"]
    runner = subprocess.Popen(
        [*command, "--config", str(config), "--output", str(out)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    arm_json = out / "arms" / "pair1-fifo" / "arm.json"
    try:
        deadline = time.monotonic() + 60
        while True:  # the hangup comes while the first arm's client runs
            assert runner.poll() is None and time.monotonic() < deadline, (
                tmp_path / "runner.log"
            ).read_text()
            try:
                if read(arm_json)["status"] == "running_client":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        runner.send_signal(signal.SIGHUP)
        code = runner.wait(120)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
        kill_recorded(out)
    said = (tmp_path / "runner.log").read_text()
    assert code == 0 and "interrupted" not in said, said
    exp = read(out / "experiment.json")
    assert exp["status"] == "complete"
    assert {arm["status"] for arm in exp["arms"].values()} == {"complete"}
