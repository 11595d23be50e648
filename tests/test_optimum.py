"""The clairvoyant optimum (CP-SAT): hand-made instances whose optimum is known, and recorded runs —
the proven bound is never above a run's makespan and never below the analytic bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from asyncroll.simulation.optimum import Instance, Step, analytic_bound, instance_from_run, solve
from tests.children import end
from tests.cli_runs import cli
from tests.conftest import REPO, invoke, tool_problem, write_workload


def chain(*steps: tuple[str, float]) -> tuple[Step, ...]:
    return tuple(Step("model" if kind == "m" else "cpu", seconds) for kind, seconds in steps)


def _fix_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """solve() fixes every hinted variable to its hint: its status is "optimal" exactly when the hint
    (the recorded run's own schedule) is a schedule, "infeasible" when it is not, whatever the load."""
    from ortools.sat.python import cp_model

    class HintOnly(cp_model.CpSolver):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.parameters.fix_variables_to_their_hinted_value = True

    monkeypatch.setattr(cp_model, "CpSolver", HintOnly)


@pytest.fixture
def hint_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _fix_the_hint(monkeypatch)


@pytest.mark.parametrize(
    ("chains", "limits", "optimal"),
    [
        # Two model turns overlap; the single worker then serialises the two 2 s jobs: 1 + 2 + 2.
        # The analytic bound says 4 (CPU ÷ 1 worker): no schedule reaches it.
        ([chain(("m", 1), ("c", 2))] * 2, (2, 2, 1), 5.0),
        # One active slot: trajectories run one after the other, whatever the workers.
        ([chain(("c", 1)), chain(("m", 2)), chain(("m", 1), ("c", 1))], (1, 4, 4), 5.0),
        # Admission in workload order: the long trajectory comes last and cannot be started first.
        ([chain(("c", 1)), chain(("c", 1)), chain(("c", 3))], (2, 1, 2), 4.0),
        # A chain's own order: CPU then model, model then CPU, one of each resource: 3 (not 4).
        ([chain(("c", 1), ("m", 2)), chain(("m", 1), ("c", 2))], (2, 1, 1), 3.0),
    ],
)
def test_exact_optimum_of_hand_made_instances(
    chains: list[tuple[Step, ...]], limits: tuple[int, int, int], optimal: float
) -> None:
    active, capacity, workers = limits
    instance = Instance(tuple(chains), active, capacity, workers)
    result = solve(instance, time_limit_s=20, threads=1)
    assert result.status == "optimal"
    assert result.best_schedule_s == pytest.approx(optimal)
    assert result.lower_bound_s == pytest.approx(optimal)
    assert result.lower_bound_s >= analytic_bound(instance) - 1e-9


def test_the_bound_stays_a_relaxation_below_the_resolution() -> None:
    # 0.4 ms steps floor to zero ticks: the solver bound is 0, the analytic bound still holds.
    instance = Instance((chain(("c", 0.0004)),) * 5, 5, 1, 1)
    result = solve(instance, time_limit_s=10, threads=1)
    assert result.solver_bound_s == 0.0
    assert result.lower_bound_s == pytest.approx(0.002)  # floor(5 × 0.4 ms) in whole milliseconds
    assert result.lower_bound_s <= analytic_bound(instance)


@pytest.mark.timeout(120)
def test_optimum_of_a_recorded_run(tmp_path: Path) -> None:
    # Four slots, one worker, jobs of different lengths: FIFO leaves the worker idle at times.
    problems = [
        tool_problem(f"p{i}", model_ms=40 + 10 * (i % 3), cpu_ms=[10, 80, 30, 120, 20][i % 5], turns=2)
        for i in range(10)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        run,
        "--max-active-trajectories",
        "4",
        "--cpu-workers",
        "1",
    ]
    assert invoke("simulate", *args).exit_code == 0
    instance = instance_from_run(run)
    assert len(instance.chains) == 10
    assert [s.kind for s in instance.chains[0]] == ["model", "cpu", "model", "cpu", "model"]
    assert (instance.active, instance.workers) == (4, 1)
    result = invoke("optimum", run, "--time-limit", "30", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    summary = json.loads((run / "summary.json").read_text())
    assert report["makespan_s"] == summary["makespan_s"]
    assert report["analytic_bound_s"] == summary["bounds"]["lower_bound_s"]
    assert report["analytic_bound_s"] - 1e-3 <= report["lower_bound_s"] <= summary["makespan_s"]
    # Small enough to be solved exactly: 1.12 s, above the analytic 1.04 s and below FIFO's 1.19 s.
    assert report["status"] == "optimal"
    assert report["lower_bound_s"] == report["best_schedule_s"] == pytest.approx(1.12)
    assert report["analytic_bound_s"] < report["lower_bound_s"] < report["makespan_s"]
    plain = invoke("optimum", run, "--time-limit", "30", "--threads", "1")
    assert "proven lower bound" in plain.stdout and "makespan ÷ best schedule" in plain.stdout


def test_optimum_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    result = invoke("optimum", tmp_path)
    assert result.exit_code == 2
    assert "no summary.json nor a readable run.json (not a run directory?)" in result.stderr
    result = invoke("optimum", tmp_path / "missing")
    assert result.exit_code == 2 and "not a directory" in result.stderr


@pytest.mark.timeout(120)
def test_optimum_of_a_real_run_is_below_its_makespan(tmp_path: Path) -> None:
    # Real worker processes sleeping, scripted model latencies: the run's own schedule is one the solver
    # may choose, so the proven optimum can only be at or below the measured makespan. (The real
    # commands, as a user runs them; the other tests run ``simulate`` and ``optimum`` in this process.)
    problems = [
        tool_problem(f"p{i}", model_ms=20 + 10 * (i % 2), cpu_ms=(15, 60, 30)[i % 3], turns=2)
        for i in range(6)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        run,
        "--max-active-trajectories",
        "3",
        "--cpu-workers",
        "1",
    ]
    assert cli("run", *args).returncode == 0
    result = cli("optimum", run, "--time-limit", "30", "--threads", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "optimal" and report["trajectories"] == 6
    assert report["analytic_bound_s"] - 1e-3 <= report["lower_bound_s"] <= report["makespan_s"]
    assert report["best_schedule_s"] <= report["makespan_s"]


@pytest.mark.timeout(120)
def test_optimum_reports_damage_clearly_and_never_a_schedule_below_its_bound(tmp_path: Path) -> None:
    """Many sub-millisecond steps floor to nothing in the solver: its schedule can look shorter than the
    analytic bound; the reported best schedule never is. A damaged run directory is a usage error naming
    the file (and line); a NaN time limit is refused; an interrupted run is solved with a warning."""
    problems = [tool_problem(f"p{i}", model_ms=1.9, cpu_ms=0.9, turns=10) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    assert (
        invoke(
            "simulate", "--workload", workload, "--output", run, "--max-active-trajectories", "2"
        ).exit_code
        == 0
    )
    result = invoke("optimum", run, "--time-limit", "20", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["best_schedule_s"] >= report["lower_bound_s"] >= report["analytic_bound_s"] - 1e-9
    assert report["lower_bound_s"] <= report["makespan_s"]
    nan = invoke("optimum", run, "--time-limit", "nan")
    assert nan.exit_code == 2 and "finite" in nan.stderr
    receipt = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**receipt, "status": "interrupted"}))
    warned = invoke("optimum", run, "--time-limit", "5", "--threads", "1")
    assert warned.exit_code == 0 and "warning: the run ended interrupted" in warned.stderr
    events = (run / "events.jsonl").read_text().splitlines()
    (run / "events.jsonl").write_text("\n".join([events[0], "[1, 2]", *events[1:]]) + "\n")
    damaged = invoke("optimum", run)
    assert damaged.exit_code == 2 and "events.jsonl line 2: not a JSON object" in damaged.stderr
    (run / "summary.json").write_text("{}")
    empty = invoke("optimum", run)
    assert empty.exit_code == 2 and "summary.json: not an asyncroll summary" in empty.stderr


@pytest.mark.timeout(120)
def test_the_runs_own_schedule_seeds_the_solver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Too large to solve in a second, the best schedule found is still no worse than the run: the
    run's own start times are the solver's hint (floored, they stay feasible). Checked with the hint
    fixed: "a schedule within one second" failed on a loaded machine (status unknown, 4 of 4 times)."""
    from bench import synthetic

    workload = synthetic.write(tmp_path / "w.jsonl", 60, 100.0, 50.0, seed=1)
    run = tmp_path / "run"
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        run,
        "--max-active-trajectories",
        "8",
        "--policy",
        "asyncroll",
    ]
    assert invoke("simulate", *args).exit_code == 0
    instance = instance_from_run(run)
    assert instance.begins is not None and all(s.start is not None for c in instance.chains for s in c)
    result = invoke("optimum", run, "--time-limit", "1", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["lower_bound_s"] <= instance.makespan_s
    _fix_the_hint(monkeypatch)
    report = json.loads(invoke("optimum", run, "--time-limit", "60", "--threads", "1", "--json").stdout)
    assert report["status"] == "optimal"  # the hint alone is a schedule
    assert report["lower_bound_s"] <= report["best_schedule_s"] <= report["makespan_s"]


@pytest.mark.timeout(120)
def test_optimum_of_a_killed_run_without_summary(tmp_path: Path) -> None:
    """A run killed with ``kill -9`` leaves events.jsonl but no summary.json, and run.json still says
    running: the work it recorded is solved with a warning; its limits come from the events, the
    analytic bound is recomputed, and the makespan that cannot be known is reported as unknown."""
    problems = [
        tool_problem(f"p{i}", model_ms=30 + 10 * (i % 2), cpu_ms=(20, 50)[i % 2], turns=2) for i in range(6)
    ]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    run = tmp_path / "run"
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        run,
        "--max-active-trajectories",
        "3",
        "--cpu-workers",
        "1",
    ]
    assert invoke("simulate", *args).exit_code == 0
    complete = json.loads(invoke("optimum", run, "--time-limit", "30", "--threads", "1", "--json").stdout)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()
    receipt = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**receipt, "status": "running"}))
    # kill -9 can cut the last line short
    events = (run / "events.jsonl").read_text().splitlines()
    (run / "events.jsonl").write_text("\n".join(events) + "\n" + events[-1][:10])

    result = invoke("optimum", run, "--time-limit", "30", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert "warning: the run never finished" in result.stderr
    report = json.loads(result.stdout)
    assert report["trajectories"] == 6
    assert report["limits"] == {"max_active_trajectories": 3, "model_capacity": 3, "cpu_workers": 1}
    assert report["makespan_s"] is None and report["makespan_over_lower_bound"] is None
    assert report["analytic_bound_s"] == pytest.approx(summary["bounds"]["lower_bound_s"], abs=1e-5)
    assert report["lower_bound_s"] == pytest.approx(complete["lower_bound_s"])
    assert any("makespan is unknown" in note for note in report["notes"])
    assert any("cut short" in note for note in report["notes"])
    assert complete["notes"] == []
    plain = invoke("optimum", run, "--time-limit", "30", "--threads", "1")
    assert plain.exit_code == 0 and "makespan n/a" in plain.stdout
    assert "note: the run stopped before it wrote summary.json" in plain.stdout

    # without measurement_started, the limits come from run.json's config
    (run / "events.jsonl").write_text("\n".join(e for e in events if "measurement_started" not in e) + "\n")
    result = invoke("optimum", run, "--time-limit", "30", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["limits"]["cpu_workers"] == 1
    # a complete run that lost its summary.json is damaged, not solved
    (run / "run.json").write_text(json.dumps({**receipt, "status": "complete"}))
    damaged = invoke("optimum", run)
    assert damaged.exit_code == 2 and "the run is complete but its summary.json is missing" in damaged.stderr


def test_the_proven_bound_is_never_below_the_runs_own_analytic_bound() -> None:
    """A batching server's run has an analytic bound with a term this model has not (its in-batch time
    ÷ its batch limit): the optimum undercut it (1.175 s against the summary's 1.202 s)."""
    chains = (chain(("m", 0.5), ("c", 0.1)), chain(("m", 0.5), ("c", 0.1)))
    plain = Instance(chains, 2, 2, 2)
    assert solve(plain, time_limit_s=10, threads=1).lower_bound_s == pytest.approx(0.6)
    batching = Instance(chains, 2, 2, 2, analytic_bound_s=0.9)
    result = solve(batching, time_limit_s=10, threads=1)
    assert result.lower_bound_s == pytest.approx(0.9)
    assert result.best_schedule_s is not None and result.best_schedule_s >= result.lower_bound_s


def _hand_made_run(run: Path, latency: object = 0.1, v: object = 1) -> Path:
    """A complete run directory written by hand: one trajectory, a 0.1 s model turn and a 0.05 s job."""
    run.mkdir()
    summary = {
        "makespan_s": 0.15,
        "limits": {"max_active_trajectories": 2, "max_inflight_model_requests": 2, "cpu_workers": 1},
        "bounds": {"model_capacity": 2, "lower_bound_s": 0.15},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    events = [
        {"t": 0.0, "event": "trajectory_started", "id": "p"},
        {"t": 0.1, "event": "model_finished", "id": "p", "turn": 0, "latency_s": latency},
        {"t": 0.15, "event": "cpu_finished", "id": "p", "kind": "tool", "execute_s": 0.05},
    ]
    lines = [json.dumps({"v": v, **event}) for event in events]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    return run


@pytest.mark.parametrize(
    ("latency", "v", "message"),
    [
        # a NaN, an infinity or a number past OR-Tools' integers crashed the solver set-up with a traceback
        (float("nan"), 1, r"line 2: model_finished lacks a valid 'latency_s' \(got nan\)"),
        (1e308, 1, r"line 2: model_finished has latency_s 1e\+308: not a duration in seconds from 0 to one"),
        (1e20, 1, "line 2: model_finished has latency_s 1e.20: not a duration"),
        # a negative or a text duration was solved as if it were one
        (-5, 1, "line 2: model_finished has latency_s -5.0: not a duration"),
        ("0.1", 1, r"line 2: model_finished lacks a valid 'latency_s' \(got '0.1'\)"),
        # another schema version's events were read as this one's
        (0.1, 2, "line 1: event schema version 2; this asyncroll reads version 1 only"),
        # a step longer than the whole run: a "proven lower bound" of 100 s above a 0.15 s makespan
        (100.0, 1, "need at least 100.05 s .* but summary.json's makespan is 0.15 s"),
    ],
)
def test_optimum_refuses_recorded_numbers_no_run_could_have(
    tmp_path: Path, latency: object, v: object, message: str
) -> None:
    import re

    from asyncroll.errors import UsageError

    run = _hand_made_run(tmp_path / "run", latency, v)
    with pytest.raises(UsageError) as refused:
        instance_from_run(run)
    assert re.search(message, str(refused.value)), str(refused.value)


def test_optimum_reads_a_consistent_hand_made_run(tmp_path: Path) -> None:
    instance = instance_from_run(_hand_made_run(tmp_path / "run"))
    assert [s.seconds for s in instance.chains[0]] == [0.1, 0.05]
    assert analytic_bound(instance) == pytest.approx(0.15)


def test_optimum_refuses_events_that_lost_work_the_summary_counts(tmp_path: Path) -> None:
    """A complete run's events.jsonl cut at a line boundary (or with events removed) was solved as if the
    rest of the work had never been: a smaller "proven" bound, and the run looking further from it."""
    from asyncroll.errors import UsageError

    run = _hand_made_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["counts"] = {"trajectories": 1}
    summary["model"] = {"requests": 1}
    summary["tools"] = {"jobs_by_kind": {"tool": 1}}
    (run / "summary.json").write_text(json.dumps(summary))
    assert len(instance_from_run(run).chains) == 1  # every count agrees
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    (run / "events.jsonl").write_text("".join(lines[:2]))  # the CPU job's line lost
    with pytest.raises(UsageError, match=r"CPU jobs: 0 in events\.jsonl, 1 in summary\.json"):
        instance_from_run(run)


@pytest.mark.usefixtures("hint_only")
def test_the_hint_of_a_run_close_to_serial_fits_the_horizon() -> None:
    """Ten 1.9 ms steps run back to back: floored, they sum to 10 ms, but the run's own start times end
    at 18 ms. The horizon was the floored sum, the hint was clamped into it and was no schedule at all: on
    200 trajectories at 1 active slot CP-SAT then found none in 3 s (status unknown, no best schedule)."""
    steps = tuple(Step("cpu", 0.0019, start=0.0019 * k) for k in range(10))
    instance = Instance((steps,), 1, 1, 1, makespan_s=0.019, analytic_bound_s=0.019, begins=(0.0,))
    result = solve(instance, time_limit_s=10, threads=1)
    assert result.status == "optimal", result  # was "infeasible": the hint broke the horizon
    assert result.best_schedule_s == pytest.approx(0.019)


def test_a_bound_above_the_makespan_by_the_events_rounding_is_the_makespan() -> None:
    """Each recorded duration is rounded to 1 µs: their sum may exceed the makespan by that much (the
    summary clamps its own bound likewise). The proven bound read 16.712777 s against a 16.712766 s
    makespan, which no schedule can beat: the run's "makespan ÷ proven bound" was 0.99999934."""
    steps = chain(("c", 0.0100005), ("m", 0.0100005))
    within = solve(Instance((steps,), 1, 1, 1, makespan_s=0.02), time_limit_s=10, threads=1)
    assert within.lower_bound_s == within.best_schedule_s == 0.02 and within.rounding_clamped
    report = within.describe(Instance((steps,), 1, 1, 1, makespan_s=0.02))
    assert report["makespan_over_lower_bound"] == 1.0 and report["rounding_clamped"] is True
    # beyond the rounding, the two disagree for real: shown as it is, not hidden
    beyond = solve(Instance((steps,), 1, 1, 1, makespan_s=0.0199), time_limit_s=10, threads=1)
    assert beyond.lower_bound_s == pytest.approx(0.020001) and not beyond.rounding_clamped


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


def test_a_solve_cut_by_the_time_limit_says_a_longer_one_may_do_better(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unknown`` (no schedule found) or ``feasible`` (not proven optimal) said nothing about the time
    limit that cut the search; the plain output now says a longer ``--time-limit`` may do better."""
    import dataclasses

    import asyncroll.simulation.optimum as optimum_module

    problems = [tool_problem(f"p{i}", model_ms=30, cpu_ms=40, turns=2) for i in range(3)]
    run = tmp_path / "run"
    assert (
        invoke(
            "simulate", "--workload", write_workload(tmp_path / "w.jsonl", problems), "--output", run
        ).exit_code
        == 0
    )
    real = optimum_module.solve
    cases: tuple[tuple[Literal["unknown", "feasible"], str], ...] = (
        ("unknown", "no schedule within --time-limit 7s"),
        ("feasible", "not proven optimal"),
    )
    for status, said in cases:

        def cut(*args: Any, status: Literal["unknown", "feasible"] = status, **kwargs: Any) -> Any:
            return dataclasses.replace(real(*args, **kwargs), status=status)

        monkeypatch.setattr(optimum_module, "solve", cut)
        result = invoke("optimum", run, "--time-limit", "7", "--threads", "1")
        assert result.exit_code == 0 and said in result.stdout and "a longer one may" in result.stdout
    monkeypatch.setattr(optimum_module, "solve", real)
    solved = invoke("optimum", run, "--time-limit", "30", "--threads", "1")
    assert solved.exit_code == 0 and "optimal" in solved.stdout and "a longer one may" not in solved.stdout
