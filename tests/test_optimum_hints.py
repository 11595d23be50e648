"""The optimum's starting point and its status: the run's schedule left-shifted (a schedule of the model,
never later than the run) is the hint, so a gappy run at one active slot is solved at once; and a best
schedule at the proven bound is reported optimal, whoever proved the bound."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asyncroll.simulation.left_shift import Shifted, left_shifted, solver_hint
from asyncroll.simulation.optimum import Instance, Step, instance_from_run, solve
from tests.conftest import invoke, tool_problem, write_workload
from tests.solver_hints import _fix_the_hint


def ticks(seconds: float) -> int:  # the optimum's own, at its default 1 ms resolution
    return max(0, math.floor(seconds / 0.001 + 1e-9))


def assert_a_schedule(instance: Instance, hint: Shifted) -> None:
    """Every constraint of the solver's model holds: chains in order from their begins, admission in
    workload order, each limit never exceeded (a sweep over the starts and ends)."""
    assert hint.begins == tuple(sorted(hint.begins))
    uses: dict[str, list[tuple[int, int]]] = {"model": [], "cpu": [], "slot": []}
    for i, chain in enumerate(instance.chains):
        at = hint.begins[i]
        for step, start in zip(chain, hint.starts[i], strict=True):
            assert start >= at
            at = start + ticks(step.seconds)
            uses[step.kind].append((start, at))
        assert hint.ends[i] == at
        uses["slot"].append((hint.begins[i], hint.ends[i]))
    limits = {"model": instance.model_capacity, "cpu": instance.workers, "slot": instance.active}
    for kind, spans in uses.items():
        events = sorted(
            [(end, -1) for start, end in spans if end > start] + [(s, 1) for s, e in spans if e > s]
        )
        held = 0
        for _, change in events:  # an end before a start at the same tick
            held += change
            assert held <= limits[kind], kind
    assert hint.makespan == max(hint.ends)


def gappy(count: int, gap: float) -> Instance:
    """``count`` trajectories at one active slot, each a model turn then a CPU job, run with ``gap`` s of
    overhead before every step (as a real run's client pays)."""
    chains, begins, at = [], [], 0.0
    for i in range(count):
        begins.append(at)
        steps = []
        for kind, seconds in (("model", 0.010 + 0.001 * (i % 3)), ("cpu", 0.020)):
            at += gap
            steps.append(Step(kind, seconds, start=at))  # type: ignore[arg-type]
            at += seconds
        chains.append(tuple(steps))
        at += gap
    return Instance(tuple(chains), 1, 1, 2, makespan_s=at, begins=tuple(begins))


def test_a_gappy_run_at_one_slot_is_hinted_back_to_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimum at one active slot is every chain back to back; hinted with the run's own gappy
    schedule, CP-SAT returned that schedule after the whole --time-limit 10 (40 trajectories of a real
    run) and needed about 40 s to close the gaps. Held to its hint, the solve is now that optimum."""
    instance = gappy(20, gap=0.004)
    chains_s = sum(s.seconds for chain in instance.chains for s in chain)
    hint = solver_hint(instance, ticks)
    assert hint is not None and hint.shifted and hint.makespan == round(chains_s * 1000)
    assert_a_schedule(instance, hint)
    _fix_the_hint(monkeypatch)
    result = solve(instance, time_limit_s=30, threads=1)
    assert result.status == "optimal", result  # was the run's own 0.855 s schedule: 0.619 s of chains
    assert result.best_schedule_s == result.lower_bound_s == pytest.approx(chains_s)


@pytest.mark.timeout(120)
def test_the_left_shift_is_a_schedule_never_later_than_the_run(tmp_path: Path) -> None:
    """On a simulated run with four slots and one worker (FIFO leaves the worker idle at times), the shift
    keeps every limit and starts no step later than the run did."""
    problems = [
        tool_problem(f"p{i}", model_ms=40 + 10 * (i % 3), cpu_ms=[10, 80, 30, 120, 20][i % 5], turns=2)
        for i in range(12)
    ]
    run = tmp_path / "run"
    args: list[str | Path] = ["--output", run, "--max-active-trajectories", "4", "--cpu-workers", "1"]
    assert (
        invoke("simulate", "--workload", write_workload(tmp_path / "w.jsonl", problems), *args).exit_code == 0
    )
    instance = instance_from_run(run)
    shifted = left_shifted(instance, ticks)
    assert shifted is not None
    assert_a_schedule(instance, shifted)
    assert instance.begins is not None
    for i, chain in enumerate(instance.chains):
        assert shifted.begins[i] <= ticks(instance.begins[i])
        for step, start in zip(chain, shifted.starts[i], strict=True):
            assert step.start is not None and start <= ticks(step.start)
    assert instance.makespan_s is not None and shifted.makespan <= ticks(instance.makespan_s)
    assert left_shifted(Instance(instance.chains, 4, 4, 1), ticks) is None  # no recorded times: no shift


def _first_schedule_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """CP-SAT stopped at its first schedule, whatever the load: its own optimum is never proven."""
    from ortools.sat.python import cp_model

    class FirstSchedule(cp_model.CpSolver):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.parameters.stop_after_first_solution = True

    monkeypatch.setattr(cp_model, "CpSolver", FirstSchedule)


def test_a_best_schedule_at_the_proven_bound_is_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batching server's analytic bound (in-batch time ÷ batch limit) can lie above every schedule of
    the recorded durations: the best one is raised to it, and nothing shorter exists. The status said
    "feasible" where CP-SAT had not proven its own optimum, and the plain output that a longer limit may
    prove a higher bound. CP-SAT is stopped at its first schedule here, whatever the load."""
    _first_schedule_only(monkeypatch)
    durations = [[0.01 * (1 + (3 * i + 7 * k) % 9) for k in range(5)] for i in range(8)]
    chains = tuple(
        tuple(Step("model" if k % 2 == 0 else "cpu", s) for k, s in enumerate(row)) for row in durations
    )
    above = sum(map(sum, durations)) + 0.002  # past the horizon: above every schedule
    result = solve(Instance(chains, 3, 2, 1, analytic_bound_s=above), time_limit_s=30, threads=1)
    assert result.status == "optimal", result  # was "feasible"
    assert result.best_schedule_s == result.lower_bound_s == pytest.approx(above)
    # a first schedule above the bound is not claimed optimal
    plain = solve(Instance(chains, 3, 2, 1), time_limit_s=30, threads=1)
    assert plain.best_schedule_s is not None and plain.best_schedule_s > plain.lower_bound_s
    assert plain.status == "feasible", plain


@pytest.mark.timeout(120)
def test_a_simulated_run_at_one_slot_is_proven_at_once(tmp_path: Path) -> None:
    """A simulated run at one active slot meets its analytic bound (the chains back to back): `optimum`
    said "feasible" after the whole time limit, with the best schedule at the proven bound, and that a
    longer one may prove a higher bound."""
    # fractions of a millisecond: the run's floored times add up past the floored durations' bound
    problems = [
        tool_problem(f"p{i}", model_ms=20.37 + 5 * (i % 4), cpu_ms=10.61 + 7 * (i % 5), turns=2)
        for i in range(30)
    ]
    run = tmp_path / "run"
    args: list[str | Path] = ["--output", run, "--max-active-trajectories", "1"]
    assert (
        invoke("simulate", "--workload", write_workload(tmp_path / "w.jsonl", problems), *args).exit_code == 0
    )
    report = json.loads(invoke("optimum", run, "--time-limit", "5", "--threads", "1", "--json").stdout)
    assert report["status"] == "optimal", report
    assert report["best_schedule_s"] == report["lower_bound_s"] == report["makespan_s"]
    plain = invoke("optimum", run, "--time-limit", "5", "--threads", "1")
    assert plain.stdout.startswith("optimal: 30 trajectories") and "a longer one may" not in plain.stdout


def test_an_optimum_of_floored_durations_says_where_the_real_one_lies(tmp_path: Path) -> None:
    """Two trajectories of a 1.9 ms model turn then a 1.9 ms CPU job on one model slot and one worker: the
    floored model is solved exactly (3 ms, raised to the 3.8 ms bound), and the best schedule of the real
    durations is 5.7 ms. The plain output says that the real optimum lies between the two."""
    problems = [tool_problem(f"p{i}", model_ms=1.9, cpu_ms=1.9, final_ms=0.0) for i in range(2)]
    run = tmp_path / "run"
    limits = ["--max-inflight-model-requests", "1", "--cpu-workers", "1"]
    done = invoke(
        "simulate", "--workload", write_workload(tmp_path / "w.jsonl", problems), "--output", run, *limits
    )
    assert done.exit_code == 0, done.output
    report = json.loads(invoke("optimum", run, "--time-limit", "5", "--threads", "1", "--json").stdout)
    assert report["status"] == "optimal" and report["lower_bound_s"] == pytest.approx(0.0038), report
    assert report["best_schedule_s"] == pytest.approx(0.0057), report
    plain = invoke("optimum", run, "--time-limit", "5", "--threads", "1").stdout
    assert "note: optimal for the durations floored to 1 ms" in plain and "between the proven bound" in plain


def test_a_floored_schedule_at_the_bound_is_not_called_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of 1.9 and 4.9 ms count 1 and 4 floored: a first floored schedule lies under the bound of the
    real durations, and a solve cut there (CP-SAT's own optimum not proven) was called optimal, though the
    real schedule of its order is longer. Only a real schedule at the bound is optimal."""
    _first_schedule_only(monkeypatch)
    chains = tuple(
        tuple(Step("model" if k % 2 == 0 else "cpu", 0.0019 if (i + k) % 3 else 0.0049) for k in range(6))
        for i in range(6)
    )
    result = solve(Instance(chains, 6, 1, 1), time_limit_s=10, threads=1)
    assert result.best_schedule_s is not None and result.best_schedule_s > result.lower_bound_s, result
    assert result.status == "feasible", result  # was "optimal"
