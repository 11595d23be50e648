"""Helpers for the simulation tests: ``simulate`` in this process, a CLI whose virtual jobs also take
real time (so that a signal lands mid-simulation), waiting and signalling, and edits of a run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import Result

from tests.children import end
from tests.conftest import REPO, invoke


def simulate_here(*args: str | Path) -> Result:
    """``asyncroll simulate ARGS`` in this process: a virtual-clock run needs no interpreter of its own
    (test_simulate_smoke_writes_a_simulated_run and the signal tests run the real command)."""
    return invoke("simulate", *args)


#: The CLI with every virtual job also taking 50 ms of real time (in a sweep's spawned cell processes
#: too, which import this module), so that a signal reliably lands while simulations are running. It runs
#: ``asyncroll.cli.main`` as the ``asyncroll`` script does (it ran ``app`` alone, without the CLI's signal
#: guard: a signal at the very end killed the process instead of ending it with 130 and its line).
SLOW_CLI = """
import sys
import time

from asyncroll.simulation import engine

_duration = engine.builtin_duration


def slow(request):
    time.sleep(0.05)
    return _duration(request)


engine.builtin_duration = slow

if __name__ == "__main__":
    from asyncroll.cli import main

    sys.argv[0] = "asyncroll"
    main()  # as the asyncroll script runs it: the CLI's signal guard and exit codes included
"""


def start_slow_cli(tmp_path: Path, *args: str | Path) -> subprocess.Popen[str]:
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(
    ready: Any, what: str, timeout: float = 30, *, writer: subprocess.Popen[Any] | None = None
) -> None:
    """Until ``ready()``. Given the process that makes it so, while that runs, however long (the test's
    hard timeout bounds it): a command's start-up on a loaded machine took ~13 s of imports, and a fixed
    30 s told a slow start from a failed one by a guess; one that ended has failed."""
    deadline = time.monotonic() + timeout
    while writer is not None or time.monotonic() < deadline:
        ended = writer is not None and writer.poll() is not None  # read first: it may write, then end
        if ready():
            return
        if ended:
            assert writer is not None
            raise AssertionError(f"{what} never happened: the process ended ({writer.returncode})")
        time.sleep(0.05)
    raise AssertionError(f"{what} never happened")


def signal_and_wait(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Send ``sig``; the process's stderr once it exited (killed after 30 s: a hang fails the test)."""
    try:
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        end(proc)
    return stderr


def _edit_json(path: Path, edit: Any) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _edit_lines(path: Path, edit: Any) -> None:
    path.write_text("".join(edit(path.read_text().splitlines(keepends=True))))
