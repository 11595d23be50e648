"""A stop signal after a command's outcome is final, as the command hands back to the CLI: it is only
recorded, as it is from the moment the outcome is final, and the exit code stays the one run.json
records. The command put the CLI's raising handler back before returning, so a signal in that stretch
(a burst of Ctrl-C as a run ends) raised KeyboardInterrupt through click's unwinding: a complete run
exited 130, and a second signal there ended the process by SIGINT with a half-printed traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.children import end
from tests.conftest import REPO

SMOKE = REPO / "examples" / "smoke.jsonl"

#: main() running ``sys.argv[2:]``; the stop signal ``sys.argv[1]`` is raised in this process as each
#: command's signal handling hands back (just after ``CommandSignals.restore``).
SIGNAL_AS_THE_COMMAND_RETURNS = """
import signal, sys
from asyncroll.runtime import signals

restore, sig = signals.CommandSignals.restore, int(sys.argv[1])
def restore_then_signal(self):
    restore(self)
    signal.raise_signal(sig)
signals.CommandSignals.restore = restore_then_signal
sys.argv = ["asyncroll", *sys.argv[2:]]
from asyncroll.cli import main
main()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("command", ["run", "simulate"])
def test_a_signal_as_a_finished_command_returns_keeps_its_exit_code(
    command: str, sig: signal.Signals, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    argv = [command, "--workload", str(SMOKE), "--output", str(out)]
    argv += ["--no-progress"] if command == "run" else []
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_AS_THE_COMMAND_RETURNS, str(int(sig)), *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = proc.communicate(timeout=90)
    finally:
        end(proc)
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "complete" and receipt["exit_code"] == 0
    assert proc.returncode == 0, stderr  # was 130: "interrupted by …" after a complete run
    assert "Traceback" not in stderr and "interrupted" not in stderr
