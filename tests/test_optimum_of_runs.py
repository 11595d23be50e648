"""``asyncroll optimum`` on recorded runs: the proven bound is never above a run's makespan and never
below the analytic bound; the run's own schedule seeds the solver; a killed run is solved with a
warning; a damaged run or numbers no run could have are refused; a cut search says so."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

from asyncroll.simulation.optimum import analytic_bound, instance_from_run
from tests.cli_runs import cli
from tests.conftest import invoke, tool_problem, write_workload
from tests.solver_hints import _fix_the_hint


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
    # what the bound was proven under: a 'feasible' result cannot be reproduced without it
    assert report["solver"] == {"time_limit_s": 30.0, "threads": 1}
    plain = invoke("optimum", run, "--time-limit", "30", "--threads", "1")
    assert "proven lower bound" in plain.stdout and "makespan ÷ best schedule" in plain.stdout


def test_optimum_of_a_sub_millisecond_run_gives_its_times_to_the_microsecond(tmp_path: Path) -> None:
    """A simulation of µs turns: 'makespan 0.000s | analytic bound 0.000s | proven lower bound 0.000s'."""
    lines = [{"id": f"p{i}", "prompt": "x", "script": [{"type": "final", "answer": "1", "latency_ms": 0.049}]}
             for i in range(2)]  # fmt: skip
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = tmp_path / "run"
    assert (
        invoke(
            "simulate", "--workload", workload, "--output", run, "--max-active-trajectories", "1"
        ).exit_code
        == 0
    )
    plain = invoke("optimum", run, "--time-limit", "30", "--threads", "1")
    assert plain.exit_code == 0, plain.stderr
    assert "makespan 0.000098s | analytic bound 0.000098s | proven lower bound 0.000098s" in plain.stdout


def test_optimum_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    result = invoke("optimum", tmp_path)
    assert result.exit_code == 2
    assert "no summary.json nor a readable run.json (not a run directory?)" in result.stderr
    result = invoke("optimum", tmp_path / "missing")
    assert result.exit_code == 2 and "missing: does not exist" in result.stderr  # was "not a directory"
    (tmp_path / "file").write_text("")
    result = invoke("optimum", tmp_path / "file")
    assert result.exit_code == 2 and "file: not a directory" in result.stderr


def test_optimum_of_a_run_json_nested_too_deeply_is_a_refusal(tmp_path: Path) -> None:
    # a damaged receipt: its JsonTooDeep was a traceback
    (tmp_path / "run.json").write_text("[" * 600 + "]" * 600)
    result = invoke("optimum", tmp_path)
    assert result.exit_code == 2, result.output
    assert "no summary.json nor a readable run.json (not a run directory?)" in result.stderr


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
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # the killed run's process: gone
    gone.wait(30)
    (run / "run.json").write_text(json.dumps({**receipt, "status": "running", "pid": gone.pid}))
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
        # half a millisecond over: past the events' rounding, within the 1 ms once allowed, it was solved
        # to a "proven" bound of 0.1505 s above the 0.15 s makespan
        (0.1005, 1, "need at least 0.1505 s .* but summary.json's makespan is 0.15 s"),
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


@pytest.mark.parametrize(
    ("section", "name", "value"),
    [
        # a ZeroDivisionError, an IndexError, or a solve "infeasible" with no schedule, instead of a refusal
        ("limits", "cpu_workers", 0),
        ("limits", "max_active_trajectories", 0),
        ("limits", "cpu_workers", -2),
        ("bounds", "model_capacity", 0),
    ],
)
def test_optimum_refuses_a_summary_whose_limits_no_run_could_have(
    tmp_path: Path, section: str, name: str, value: int
) -> None:
    run = _hand_made_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary[section][name] = value
    (run / "summary.json").write_text(json.dumps(summary))
    result = invoke("optimum", run, "--time-limit", "5", "--threads", "1")
    assert result.exit_code == 2, result.output
    assert "summary.json: limits must be ≥ 1" in result.stderr and f"{name} {value}" in result.stderr


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # "invalid literal for int() with base 10: 'x'"; 1.5 was read as 1
        (
            lambda s: s["limits"].update(cpu_workers="x"),
            "limits: cpu_workers must be a whole number, not a string 'x'",
        ),
        (
            lambda s: s["limits"].update(cpu_workers=1.5),
            "limits: cpu_workers must be a whole number, not a number 1.5",
        ),
        # a traceback each: "cannot convert float infinity to integer", and CP-SAT's "Unable to cast"
        (
            lambda s: s["limits"].update(cpu_workers=math.inf),
            "cpu_workers must be a whole number, not a number inf",
        ),
        (lambda s: s["bounds"].update(model_capacity=10**30), "bounds: model_capacity must fit in 64 bits"),
        (
            lambda s: s.update(makespan_s=math.nan),
            "makespan_s must be a finite number of seconds from 0, got nan",
        ),
        (lambda s: s.update(limits=[1]), "not an asyncroll summary (missing or malformed 'limits')"),
    ],
)
def test_optimum_names_a_summary_value_of_the_wrong_kind(tmp_path: Path, edit: Any, message: str) -> None:
    """Each was Python's own words (or a traceback, or "makespan nans" printed as a result)."""
    run = _hand_made_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    edit(summary)
    (run / "summary.json").write_text(json.dumps(summary))
    result = invoke("optimum", run, "--time-limit", "5", "--threads", "1")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {run / 'summary.json'}: ") and message in result.stderr, (
        result.stderr
    )
    assert "Traceback" not in result.output


def test_optimum_says_why_events_cannot_be_read_in_words(tmp_path: Path) -> None:
    """It was "[Errno 21] Is a directory: '.../events.jsonl'", the OSError as Python prints it."""
    run = _hand_made_run(tmp_path / "run")
    (run / "events.jsonl").unlink()
    (run / "events.jsonl").mkdir()
    result = invoke("optimum", run)
    assert result.exit_code == 2
    assert result.stderr == f"error: {run}: cannot read events.jsonl: Is a directory\n"


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


def test_optimum_of_a_stopped_run_says_its_cancelled_steps_count_up_to_the_stop(tmp_path: Path) -> None:
    """A request a stopped run cancelled ends with ``model_failed`` (kind ``cancelled``) and its latency
    up to the stop, which the solve counts (as the summary's bound does); the warning said that "steps
    still running when it stopped" were left out. A run killed while preparing "ended preparing"."""
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p", model_ms=10, cpu_ms=5)])
    run = tmp_path / "run"
    assert invoke("simulate", "--workload", workload, "--output", run).exit_code == 0
    receipt = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**receipt, "status": "interrupted"}))
    lines = (run / "events.jsonl").read_text().splitlines()
    steps = sum('"model_finished"' in line or '"cpu_finished"' in line for line in lines)
    last = max(i for i, line in enumerate(lines) if '"model_finished"' in line)
    cancelled = {**json.loads(lines[last]), "event": "model_failed", "kind": "cancelled", "status": None}
    lines[last] = json.dumps(cancelled)
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    result = invoke("optimum", run, "--time-limit", "5", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["steps"] == steps  # the cancelled request among them
    assert "a request or job it cancelled counts up to the stop" in result.stderr
    assert "still running when it stopped" not in result.stderr
    (run / "run.json").write_text(json.dumps({**receipt, "status": "preparing", "pid": None}))
    (run / "summary.json").unlink()  # killed while preparing: no summary either
    preparing = invoke("optimum", run, "--time-limit", "5", "--threads", "1")
    assert "warning: the run never finished (run.json says preparing)" in preparing.stderr


def test_optimum_of_a_run_killed_after_its_summary_says_only_its_exports_are_missing(tmp_path: Path) -> None:
    """A run killed (kill -9, a container's stop) while it wrote its exports: summary.json is whole, run.json
    still says running. The solve uses all of its work and its makespan, as it should, but the warning said
    that 'steps still running when it was killed, and trajectories never started, are left out': none
    were."""
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p", model_ms=10, cpu_ms=5)])
    run = tmp_path / "run"
    assert invoke("simulate", "--workload", workload, "--output", run).exit_code == 0
    receipt = json.loads((run / "run.json").read_text())
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # the killed run's process: gone
    gone.wait(30)
    (run / "run.json").write_text(json.dumps({**receipt, "status": "running", "pid": gone.pid}))
    result = invoke("optimum", run, "--time-limit", "5", "--threads", "1")
    assert result.exit_code == 0, result.stderr
    assert "left out" not in result.stderr and "never finished" not in result.stderr, result.stderr
    said = "note: the run was killed after it wrote summary.json (which says 'complete'; run.json still says"
    assert said in result.stderr, result.stderr
    assert "makespan n/a" not in result.stdout


def test_optimum_of_a_run_whose_event_loop_stalled_says_the_makespan_includes_it(tmp_path: Path) -> None:
    """A run whose client's event loop stalled (summary.json ``event_loop``): its makespan holds that time,
    in which admission, dispatch and reading waited for the loop, and ``makespan ÷ best schedule`` blamed
    it on the schedule without a word. The notes say it; a run whose loop did not stall has none."""
    run = _hand_made_run(tmp_path / "run")
    assert not any("event loop" in n for n in instance_from_run(run).notes)
    summary = json.loads((run / "summary.json").read_text())
    summary["event_loop"] = {"watched": True, "stalls": 1, "stalled_s": 0.05, "fraction_of_makespan": 0.333}
    (run / "summary.json").write_text(json.dumps(summary))
    notes = instance_from_run(run).notes
    assert any("event loop stalled 0.050 s" in n and "33%" in n for n in notes), notes
    # a loop with more work than it can run is late too: it waited, not 'nothing was admitted'
    assert any("waited for the loop" in n and "nothing was" not in n for n in notes), notes


def test_optimum_of_a_run_stopped_by_job_control_says_the_makespan_includes_the_stop(tmp_path: Path) -> None:
    """A stop of the whole process (Ctrl-Z, SIGSTOP: summary.json ``event_loop.stopped_s``) is no loop
    stall, but its time is in the makespan all the same, whatever the schedule: the notes say so."""
    run = _hand_made_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["event_loop"] = {"watched": True, "stalls": 0, "stalled_s": 0.0, "stops": 1, "stopped_s": 2.5}
    (run / "summary.json").write_text(json.dumps(summary))
    notes = instance_from_run(run).notes
    assert any("stopped (job control) 2.500 s" in n for n in notes), notes
    assert not any("event loop stalled" in n for n in notes), notes
