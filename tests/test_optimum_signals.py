"""A stop signal during the optimum's solve: the search stops even when the signal came before it began,
the command exits 130 at once on SIGINT, SIGTERM and SIGHUP, and a burst of Ctrl-C does not abort it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.children import end
from tests.conftest import REPO


@pytest.mark.timeout(60)
def test_a_stop_signal_stops_the_search_even_one_that_came_before_it_began() -> None:
    """The signal's exception goes on once the solver returned; CP-SAT drops a stop_search made before its
    search began, so it is asked again until it returns (a search begun just after the signal ran on)."""
    from asyncroll.simulation.stoppable_solve import solve_stoppably

    class Solver:
        def __init__(self) -> None:
            self.asked = threading.Event()  # stop_search was called (before the search began: dropped)
            self.called = threading.Event()  # solve was called: a signal before it abandons the solve
            self.begin = threading.Event()
            self.searching = threading.Event()
            self.stopped = threading.Event()

        def solve(self, model: object) -> str:
            self.called.set()
            self.begin.wait()
            self.searching.set()
            self.stopped.wait()
            return "stopped"

        def stop_search(self) -> None:
            self.asked.set()
            if self.searching.is_set():
                self.stopped.set()

    class Stop(Exception):
        pass

    def stop(signum: int, frame: object) -> None:
        raise Stop

    solver = Solver()
    main = threading.get_ident()

    def waiting() -> bool:
        """The main thread waits for the solver inside solve_stoppably (not still starting its thread)."""
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_back is not None:
            if frame.f_back.f_code.co_name == "solve_stoppably":
                return frame.f_code.co_name == "wait"
            frame = frame.f_back
        return False

    def signal_then_begin() -> None:
        solver.called.wait()  # on a loaded machine the solver's thread may not have called it yet
        while not waiting():
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGUSR1)
        solver.asked.wait()
        solver.begin.set()

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        threading.Thread(target=signal_then_begin, daemon=True).start()
        with pytest.raises(Stop):
            solve_stoppably(solver, None)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert solver.stopped.is_set()  # the solver returned before the exception went on


#: `asyncroll optimum RUN` through the CLI's main(), saying "solving" as CP-SAT's solve is called.
OPTIMUM_SAYING_SOLVING = """
import sys
from ortools.sat.python import cp_model

real_solve = cp_model.CpSolver.solve

def solve(self, model, *args, **kwargs):
    print("solving", flush=True)
    return real_solve(self, model, *args, **kwargs)

cp_model.CpSolver.solve = solve
sys.argv = ["asyncroll", "optimum", sys.argv[1], "--time-limit", "600", "--threads", "2"]
from asyncroll.cli import main
main()
"""


def _long_run(run: Path) -> Path:
    """A complete run of 300 trajectories × 4 steps of 10-200 ms, run one after the other (8 active, 4
    in flight, 2 workers allowed): minutes from a proven optimum."""
    import random

    rng = random.Random(0)
    run.mkdir()
    lines, t = [], 0.0
    for i in range(300):
        lines.append({"v": 1, "t": t, "event": "trajectory_started", "id": str(i)})
        for kind in ("model", "cpu", "model", "cpu"):
            seconds = round(rng.uniform(0.01, 0.2), 6)
            t = round(t + seconds, 6)
            if kind == "model":
                lines.append({"v": 1, "t": t, "event": "model_finished", "id": str(i), "latency_s": seconds})
            else:
                lines.append({"v": 1, "t": t, "event": "cpu_finished", "id": str(i), "execute_s": seconds})
    (run / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = {
        "makespan_s": t,
        "limits": {"max_active_trajectories": 8, "max_inflight_model_requests": 4, "cpu_workers": 2},
        "bounds": {"model_capacity": 4, "lower_bound_s": 0.0},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("sighup_not_ignored")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_during_the_solve_exits_130_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    """The solve ran in C++ where no Python signal handler runs: SIGTERM and SIGHUP waited for the whole
    --time-limit (37 s of 40), and CP-SAT's own SIGINT handler ended the solve, printed its result and
    exited 0, as if nothing had come. Now each ends it at once: exit 130, as for every command."""
    run = _long_run(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-c", OPTIMUM_SAYING_SOLVING, str(run)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "solving\n"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)  # ten times less than --time-limit
    finally:
        end(proc)
    assert proc.returncode == 130, (stdout, stderr)
    assert stdout == "" and "Traceback" not in stderr, (stdout, stderr)


#: As OPTIMUM_SAYING_SOLVING, and saying "stopping" once the first stop_search asked CP-SAT to stop, which
#: then waits for a line of stdin: the second signal of a burst comes while the solver is stopping.
OPTIMUM_STOPPING_SLOWLY = OPTIMUM_SAYING_SOLVING.replace(
    "cp_model.CpSolver.solve = solve\n",
    """cp_model.CpSolver.solve = solve
real_stop, calls = cp_model.CpSolver.stop_search, []

def stop_search(self):
    calls.append(1)
    real_stop(self)
    if len(calls) == 1:
        print("stopping", flush=True)
        sys.stdin.readline()

cp_model.CpSolver.stop_search = stop_search
""",
)


@pytest.mark.timeout(120)
def test_a_burst_of_ctrl_c_during_the_solve_still_exits_130(tmp_path: Path) -> None:
    """A second Ctrl-C while the solver was stopping ended the command before CP-SAT returned; its thread
    came back from C++ into a finalising interpreter and the process aborted (SIGABRT, 134 in a shell:
    "terminate called without an active exception")."""
    run = _long_run(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-c", OPTIMUM_STOPPING_SLOWLY, str(run)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "solving\n"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "stopping\n"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 130, (stdout, stderr)
    assert "terminate called" not in stderr and "Traceback" not in stderr, stderr
