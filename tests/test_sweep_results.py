"""What a sweep writes: every cell with paired comparisons over seeds, custom (oracle) arms, the same rows
in worker processes as in one, a cell that fails named and nothing recorded, sweep.json's record of what
produced it, a cell reproduced from its seed's workload, and the table's counts, zeros and failures."""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import SMOKE, cli
from tests.conftest import REPO, tool_problem, write_workload
from tests.simulations import simulate_here


def test_sweep_writes_every_cell_with_paired_comparisons(tmp_path: Path) -> None:
    problems = [tool_problem(f"p{i}", model_ms=30 + i, cpu_ms=40, turns=2) for i in range(10)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "sweep"
    result = cli(
        "simulate",
        "--sweep",
        "--workload",
        workload,
        "--output",
        out,
        "--policies",
        "fifo,sync",
        "--active",
        "2,8",
        "--workers",
        "1,2",
        "--seeds",
        "3",
        "--jitter",
        "0.3",
        "--progress",
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    assert len(rows) == 2 * 4 * 3
    # --progress off a terminal: one plain line per cell, in order (after the warning that sync ignores 2, 8)
    warning, *lines = result.stderr.splitlines()
    assert warning.startswith("warning: --policies sync runs one trajectory at a time: --active 2, 8")
    assert [line.split("]")[0] for line in lines] == [f"[{k}/24" for k in range(1, 25)]
    assert lines[0].startswith("[1/24] fifo 2 / 4 / 1 seed 0: makespan ")
    assert {r["policy"] for r in rows} == {"fifo", "sync"}
    assert all(int(r["completed"]) == 10 for r in rows)
    # bound and makespan are each rounded to the microsecond
    assert all(float(r["lower_bound_s"]) <= float(r["makespan_s"]) + 2e-6 for r in rows)
    # seeds change the timings; the same seed gives the same timings to every policy (paired)
    fifo = {
        (r["active"], r["workers"], r["seed"]): float(r["makespan_s"]) for r in rows if r["policy"] == "fifo"
    }
    assert len({v for k, v in fifo.items() if k[:2] == ("8", "2")}) == 3
    sync = [r for r in rows if r["policy"] == "sync"]
    assert all(float(r["makespan_s"]) >= fifo[(r["active"], r["workers"], r["seed"])] - 1e-9 for r in sync)
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["spec"]["seeds"] == 3 and len(summary["cells"]) == 8
    # cells hold numbers (min / median / max over seeds), not the table's display strings
    cell = next(
        c for c in summary["cells"] if c["policy"] == "sync" and (c["active"], c["workers"]) == (8, 2)
    )
    runs = {r["seed"]: float(r["makespan_s"]) for r in sync if (r["active"], r["workers"]) == ("8", "2")}
    seeds = list(runs.values())
    assert cell["makespan_s"] == {"min": min(seeds), "median": statistics.median(seeds), "max": max(seeds)}
    paired = [makespan / fifo[("8", "2", seed)] - 1 for seed, makespan in runs.items()]
    assert cell["vs_fifo"]["max"] == pytest.approx(max(paired))
    assert next(c for c in summary["cells"] if c["policy"] == "fifo")["vs_fifo"] is None
    table = (out / "sweep.md").read_text()
    assert table.count("\n| sync |") == 4 and "+" in table and "completed per hour" in table


def test_custom_arms_run_their_own_policy_objects(tmp_path: Path) -> None:
    """A bench's arm (an oracle rule) is a policy object built per seed from the jittered workload; the
    runtime uses it instead of the configured policy and its rows carry the arm's label."""
    from dataclasses import dataclass

    from asyncroll.policies.base import Decision, Policy, QueueSnapshot
    from asyncroll.policies.baseline import Fifo
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep

    @dataclass(frozen=True)
    class Newest:
        name: str = "newest"

        def choose(self, snapshot: QueueSnapshot) -> Decision:
            return Decision(snapshot.jobs[-1].job_id, "newest")

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30 + 7 * i, turns=2) for i in range(8)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    seen: list[str] = []

    def newest(seeded: Path) -> Newest:
        seen.append(seeded.name)
        return Newest()

    spec = SweepSpec(("fifo",), (8,), (4,), (1,), 2, 0.2)
    custom: dict[str, Callable[[Path], Policy]] = {"fifo object": lambda _: Fifo(), "newest": newest}
    rows = run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), tmp_path / "s", custom)
    assert seen == ["seed-0.jsonl", "seed-1.jsonl"]
    by = {(r["policy"], r["seed"]): r for r in rows}
    assert len(rows) == 6
    for seed in (0, 1):
        assert by["fifo object", seed]["makespan_s"] == by["fifo", seed]["makespan_s"]
        assert by["fifo object", seed]["reorders"] == 0 and by["newest", seed]["reorders"] > 0
        assert by["newest", seed]["completed"] == 8


def test_the_oracle_bench_rules_know_every_job_they_see(tmp_path: Path) -> None:
    """bench.oracle_map's clairvoyant rules look every queued job up by (problem, turn, kind): each is
    found, and the work left after a job is every later model turn and CPU job."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep
    from bench import oracle_map, synthetic

    workload = synthetic.write(tmp_path / "w.jsonl", 12, 100.0, 80.0, seed=2)
    durations = oracle_map.true_durations(workload)
    first = json.loads(workload.read_text().splitlines()[0])
    script = first["script"]
    cpu0, rest0 = durations[first["id"], 0, "tool"]
    assert cpu0 == pytest.approx(script[0]["cpu_ms"] / 1000)
    later = sum(a["latency_ms"] + a.get("cpu_ms", 0) for a in script[1:]) / 1000
    assert rest0 == pytest.approx(later)
    assert durations[first["id"], len(script) - 1, "grade"] == (0.0, 0.0)
    spec = SweepSpec(("fifo",), (4,), (4,), (1,), 1, 0.25)
    rows = run_sweep(
        workload, tmp_path, {"max_turns": 6}, spec, SimulationSettings(), tmp_path / "s", oracle_map.ARMS
    )
    assert {r["policy"] for r in rows} == {"fifo", *oracle_map.ARMS}
    assert all(r["completed"] == 12 for r in rows)
    assert all(r["reorders"] > 0 for r in rows if r["policy"] in oracle_map.ARMS)  # the oracles decided


def test_the_oracles_add_the_work_left_left_to_right_on_every_python(tmp_path: Path) -> None:
    """The work left after a job is its trajectory's later turns added left to right, as ``sum`` did on
    Python 3.11: 0.1 + 0.2 + 0.3 s is 0.6000000000000001 there and 0.6 by 3.12's compensated ``sum``, and
    the clairvoyant rule ranks queued jobs by it (another order at a tie on another Python)."""
    from bench import oracle_map

    call = {"type": "tool", "name": "sleep_ms", "arguments": {"milliseconds": 1}}
    latencies = (0, 100, 200)
    script: list[dict[str, Any]] = [{**call, "latency_ms": ms} for ms in latencies]
    script.append({"type": "final", "answer": "ok", "latency_ms": 300})
    problem = {"id": "p", "prompt": "p", "tools": [{"name": "sleep_ms"}], "script": script}
    durations = oracle_map.true_durations(write_workload(tmp_path / "w.jsonl", [problem]))
    assert durations["p", 0, "tool"] == (0.0, 0.1 + 0.2 + 0.3)


PARALLEL = """
import sys
from pathlib import Path
from typing import Any

from asyncroll.simulation.engine import SimulationSettings
from asyncroll.simulation.sweep import SweepSpec, run_sweep
from bench import oracle_map, synthetic

if __name__ == "__main__":
    tmp, jobs = Path(sys.argv[1]), int(sys.argv[2])
    workload = synthetic.write(tmp / f"w{jobs}.jsonl", 16, 100.0, 80.0, seed=3)
    spec = SweepSpec(("fifo", "asyncroll"), (4, 8), (4,), (1,), 2, 0.25)
    settings = SimulationSettings()
    run_sweep(workload, tmp, {"max_turns": 6}, spec, settings, tmp / f"jobs{jobs}", oracle_map.ARMS, jobs)
"""


@pytest.mark.timeout(120)
def test_a_sweep_in_worker_processes_gives_the_same_rows_in_the_same_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``jobs`` only spreads cells over fresh processes: every row — the pressure rule's learned state,
    a custom (pickled) oracle arm, the paired seeds — is the same as in one process. (The sweep with a
    pool runs in its own interpreter: a process pool leaves multiprocessing's resource tracker running
    until its parent exits; ``jobs`` 1 uses no pool and runs the same script in this process.)"""
    import runpy

    from bench import oracle_map

    script = tmp_path / "parallel.py"
    script.write_text(PARALLEL)
    monkeypatch.setattr(sys, "argv", [str(script), str(tmp_path), "1"])
    runpy.run_path(str(script), run_name="__main__")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    tables = [(tmp_path / f"jobs{jobs}" / "sweep.csv").read_text() for jobs in (1, 2)]
    assert tables[0] == tables[1]
    rows = list(csv.DictReader(tables[0].splitlines()))
    assert len(rows) == 2 * (2 + len(oracle_map.ARMS)) * 2
    assert any(int(r["reorders"]) > 0 for r in rows if r["policy"] == "asyncroll")


def test_a_cell_whose_run_fails_stops_the_sweep_and_names_the_cell(tmp_path: Path) -> None:
    """A run that fails (here its policy raises) has no meaningful makespan: the sweep must not record
    one as if it were a result. What ran before it is kept, marked partial, and the error says where:
    it used to leave a directory of seeded workloads only, which refused the same command again without
    a word about it."""
    from dataclasses import dataclass

    from asyncroll.errors import SimulationError
    from asyncroll.policies.base import Decision, QueueSnapshot
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep

    @dataclass(frozen=True)
    class Broken:
        name: str = "broken"

        def choose(self, snapshot: QueueSnapshot) -> Decision:
            raise RuntimeError("this policy is broken on purpose")

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo",), (4,), (4,), (1,), 1, 0.2)
    out = tmp_path / "s"
    with pytest.raises(
        SimulationError, match=r"sweep cell broken at 4 / 4 / 1, seed 0: .*ended failed.*"
    ) as err:
        run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out, {"broken": lambda _: Broken()})
    kept = f"; the simulation before it is in {out} (sweep.md, marked partial)"
    assert str(err.value).endswith(kept + "; a new --output runs the sweep again")
    [row] = csv.DictReader((out / "sweep.csv").read_text().splitlines())  # fifo's, run before the broken
    assert row["policy"] == "fifo"
    partial = (
        "**Partial: stopped by a failed simulation (broken at 4 / 4 / 1, seed 0) after 1 of 2 simulations**"
    )
    assert (out / "sweep.md").read_text().startswith(partial)
    document = json.loads((out / "sweep.json").read_text())
    assert (document["complete"], document["simulations"]) == (False, {"done": 1, "total": 2})
    # the first cell failing: nothing ran, the seeded workloads are what is there, and the error says so
    spec = SweepSpec((), (4,), (4,), (1,), 1, 0.2)
    with pytest.raises(SimulationError, match=r"; its seeded workloads are in .*first.workloads; a new"):
        run_sweep(
            workload,
            tmp_path,
            {},
            spec,
            SimulationSettings(),
            tmp_path / "first",
            {"broken": lambda _: Broken()},
        )
    assert sorted(p.name for p in (tmp_path / "first").iterdir()) == ["workloads"]


@pytest.mark.timeout(60)
def test_sweep_json_records_what_produced_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncroll.code_identity import code_version
    from asyncroll.outputs.receipt import environment, file_sha256, versions

    (tmp_path / "tools").mkdir()
    out = tmp_path / "sweep"
    args = ["--policies", "fifo", "--seeds", "1", "--jobs", "1", "--max-turns", "5", "--limit", "2"]
    args += ["--tool-timeout", "9", "--tool-errors", "observe", "--tool-root", str(tmp_path / "tools")]
    argv = ["asyncroll", "simulate", "--sweep", "--workload", str(SMOKE), "--output", str(out), *args]
    monkeypatch.setattr(sys, "argv", argv)  # what the CLI would see (in this process: pytest's)
    result = simulate_here(*argv[2:])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "sweep.json").read_text())
    assert record["workload"] == str(SMOKE) and record["workload_sha256"] == file_sha256(SMOKE)
    assert record["run_settings"] == {
        "max_turns": 5,
        "limit": 2,
        "tool_timeout": 9.0,
        "tool_errors": "observe",
        "tool_root": str((tmp_path / "tools").resolve()),
    }
    assert record["versions"] == versions() and record["host"]["cpu_count"] == os.cpu_count()
    assert record["command"] == argv and record["cwd"] == os.getcwd()
    # which asyncroll (checkout commit, source digest) and environment, as run.json records them: a
    # sweep's command has relative paths and '0.1.0' names every checkout
    assert record["code"] == code_version() and record["environment"] == environment()
    assert [r["completed"] for r in record["rows"]] == [2]


def test_a_sweep_cell_reruns_from_its_seeds_workload_and_the_recorded_tool_root(tmp_path: Path) -> None:
    """As docs/SIMULATION.md says: ``simulate --workload OUT/workloads/seed-N.jsonl --tool-root <sweep.json's
    tool_root>`` with the cell's policy and limits reproduces the cell's row (the tool files stay where
    they were)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "crunch.py").write_text("def crunch(n):\n    return n\n")
    tool = {"name": "crunch", "inputs": {"n": "int"}, "implementation": "crunch.py"}
    problems = [
        {
            "id": f"p{i}",
            "prompt": "p",
            "tools": [tool],
            "script": [
                {
                    "type": "tool",
                    "name": "crunch",
                    "arguments": {"n": i},
                    "cpu_ms": 20 + 9 * i,
                    "latency_ms": 15,
                },
                {"type": "final", "answer": "x", "latency_ms": 10},
            ],
        }
        for i in range(10)
    ]
    workload = write_workload(tools / "w.jsonl", problems)
    out = tmp_path / "sweep"
    swept = simulate_here(
        "--sweep",
        "--workload",
        workload,
        "--output",
        out,
        "--policies",
        "tool_first",
        "--active",
        "4",
        "--inflight",
        "2",
        "--workers",
        "1",
        "--seeds",
        "2",
        "--jobs",
        "1",
    )
    assert swept.exit_code == 0, swept.output
    row = next(r for r in csv.DictReader((out / "sweep.csv").read_text().splitlines()) if r["seed"] == "1")
    root = json.loads((out / "sweep.json").read_text())["run_settings"]["tool_root"]
    cell = tmp_path / "cell"
    again = simulate_here(
        "--workload",
        out / "workloads" / "seed-1.jsonl",
        "--tool-root",
        root,
        "--output",
        cell,
        "--policy",
        "tool_first",
        "--max-active-trajectories",
        "4",
        "--max-inflight-model-requests",
        "2",
        "--cpu-workers",
        "1",
    )
    assert again.exit_code == 0, again.output
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["makespan_s"] == pytest.approx(float(row["makespan_s"]), abs=1e-6)


def test_a_seed_with_no_completion_counts_as_zero_per_hour_not_as_missing(tmp_path: Path) -> None:
    """Every trajectory hits max_turns: each seed completes nothing in a measured window, so its
    completions per hour is a measured 0. The table once showed "n/a" (a 0 was dropped as if missing),
    and with some seeds at 0 the median was taken over the others only."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep
    from asyncroll.simulation.sweep_table import aggregate

    problems = [tool_problem(f"p{i}", model_ms=30, cpu_ms=40, turns=3) for i in range(4)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo",), (2,), (4,), (1,), 2, 0.3)
    rows = run_sweep(workload, tmp_path, {"max_turns": 2}, spec, SimulationSettings(), tmp_path / "s")
    assert [r["completed"] for r in rows] == [0, 0] and all(r["makespan_s"] > 0 for r in rows)
    assert [r["completed_per_hour"] for r in rows] == [0.0, 0.0]
    cell = json.loads((tmp_path / "s" / "sweep.json").read_text())["cells"][0]
    assert cell["completed_per_hour"] == {"min": 0.0, "median": 0.0, "max": 0.0}
    assert "| 0 / 0 / 0 |" in (tmp_path / "s" / "sweep.md").read_text()
    # one seed at 0 of three: the median is the middle of all three, not of the two others
    mixed = [{**rows[0], "seed": s, "completed_per_hour": v} for s, v in enumerate((0.0, 100.0, 120.0))]
    assert aggregate(mixed)[0]["completed_per_hour"] == {"min": 0.0, "median": 100.0, "max": 120.0}
    missing = [{**mixed[0], "completed_per_hour": None}, *mixed[1:]]  # null (a 0 s window) stays out
    assert aggregate(missing)[0]["completed_per_hour"] == {"min": 100.0, "median": 110.0, "max": 120.0}


def test_a_cell_with_failed_trajectories_is_named_under_the_table(tmp_path: Path) -> None:
    """A trajectory that fails ends early, so its cell's makespan covers less work than the others':
    sweep.md showed nothing of it (only the CSV's per-seed ``failed`` did). The cells with failures are
    listed under the table, with their count over the seeds (``failed`` in sweep.json's cells)."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep

    problems = [tool_problem("slow", model_ms=30, cpu_ms=400), tool_problem("quick", model_ms=30, cpu_ms=40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo", "tool_first"), (2,), (4,), (1,), 2, 0.1)
    base = {"tool_timeout": 0.2, "tool_errors": "fail"}
    rows = run_sweep(workload, tmp_path, base, spec, SimulationSettings(), tmp_path / "s")
    assert [(r["completed"], r["failed"]) for r in rows] == [(1, 1)] * 4
    cells = json.loads((tmp_path / "s" / "sweep.json").read_text())["cells"]
    assert [c["failed"] for c in cells] == [2, 2]
    table = (tmp_path / "s" / "sweep.md").read_text()
    assert table.endswith(
        "Failed trajectories (those cells' makespans cover less work; compare them with care):\n"
        "- fifo at 2 / 4 / 1: 2 over 2 seed(s)\n"
        "- tool_first at 2 / 4 / 1: 2 over 2 seed(s)\n"
    )
    clean = run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), tmp_path / "t")
    assert all(r["failed"] == 0 for r in clean)
    assert "Failed trajectories" not in (tmp_path / "t" / "sweep.md").read_text()


def test_reorders_are_shown_as_counts() -> None:
    """Reorders are counts: the table showed them as ``136.000 / 164.000 / 168.000``."""
    from asyncroll.simulation.sweep_table import aggregate, markdown

    row: dict[str, Any] = {
        "policy": "tool_first",
        "active": 8,
        "inflight": 4,
        "workers": 1,
        "makespan_s": 2.0,
    }
    row |= {"efficiency": 0.9, "cpu_blocked_s": 0.5, "failed": 0, "completed_per_hour": 10.0}
    rows = [{**row, "seed": seed, "reorders": n} for seed, n in enumerate((136, 164, 168, 170))]
    line = next(line for line in markdown(aggregate(rows)).splitlines() if line.startswith("| tool_first"))
    assert "| 136 / 166 / 170 |" in line
    two = markdown(aggregate(rows[:2]))  # the median of two seeds: a half
    assert "| 136 / 150 / 164 |" in two
    assert "| 1 / 1.5 / 2 |" in markdown(aggregate([{**r, "reorders": r["seed"] + 1} for r in rows[:2]]))


def test_a_first_cell_failing_after_its_workloads_were_removed_does_not_point_at_them(tmp_path: Path) -> None:
    """The sweep's folder removed while its first cell ran (a scratch cleaner): the cell failed reading its
    seeded workload, and the error said 'its seeded workloads are in OUT/workloads', which was gone."""
    import shutil
    from dataclasses import dataclass

    from asyncroll.errors import SimulationError
    from asyncroll.policies.base import Decision, QueueSnapshot
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep

    out = tmp_path / "s"

    @dataclass(frozen=True)
    class Removing:
        name: str = "removing"

        def choose(self, snapshot: QueueSnapshot) -> Decision:
            shutil.rmtree(out, ignore_errors=True)
            raise RuntimeError("the sweep's folder was removed")

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec((), (4,), (4,), (1,), 1, 0.2)
    with pytest.raises(SimulationError) as err:
        run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out, {"removing": lambda _: Removing()})
    assert "seeded workloads are in" not in str(err.value)
    removed = f"; {out / 'workloads'} was removed while the sweep ran; a new --output runs the sweep again"
    assert str(err.value).endswith(removed), err.value


def test_completions_per_hour_keep_their_significant_digits() -> None:
    """Hours-long trajectories complete a few an hour: the table showed the rate as whole numbers, so
    0.41, 0.44 and 0.47 an hour read "0 / 0 / 0" (none completed?) and 2.71 against 3.24 read "3 / 3"."""
    from asyncroll.simulation.sweep_table import aggregate, markdown

    row: dict[str, Any] = {"active": 1, "inflight": 4, "workers": 1, "makespan_s": 500000.0, "reorders": 0}
    row |= {"efficiency": 0.9, "cpu_blocked_s": 0.5, "failed": 0}
    rows = [
        {**row, "policy": policy, "seed": seed, "completed_per_hour": v}
        for policy, values in (("fifo", (0.41, 0.44, 0.47)), ("tool_first", (2.71, 3.24, 14.954188)))
        for seed, v in enumerate(values)
    ]
    table = markdown(aggregate(rows))
    assert "| 0.41 / 0.44 / 0.47 |" in table
    assert "| 2.71 / 3.24 / 14.95 |" in table
    big = [{**rows[0], "completed_per_hour": 1830942935.61184}]
    assert "| 1,830,942,936 / 1,830,942,936 / 1,830,942,936 |" in markdown(aggregate(big))


def test_a_change_against_fifo_on_fewer_seeds_than_its_cell_says_how_many() -> None:
    """A sweep stopped part-way can hold a policy's seed whose fifo run never finished: its change against
    fifo is paired over the seeds that have both, and the table said nothing of that (QA found a cell of
    three seeds whose change stood on one)."""
    from asyncroll.simulation.sweep_table import aggregate, markdown

    def row(policy: str, seed: int, makespan: float) -> dict[str, Any]:
        return {
            "policy": policy, "active": 4, "inflight": 2, "workers": 1, "seed": seed, "makespan_s": makespan,
            "efficiency": 0.9, "cpu_blocked_s": 1.0, "reorders": 0, "failed": 0, "completed_per_hour": 60.0,
        }  # fmt: skip

    rows = [
        row("fifo", 0, 10.0),
        row("tool_first", 0, 9.0),
        row("tool_first", 1, 12.0),
        row("tool_first", 2, 8.0),
    ]
    cells = {c["policy"]: c for c in aggregate(rows)}
    assert cells["tool_first"]["seeds"] == 3 and cells["tool_first"]["paired_seeds"] == 1
    assert cells["tool_first"]["vs_fifo"] == pytest.approx({"min": -0.1, "median": -0.1, "max": -0.1})
    assert cells["fifo"]["paired_seeds"] is None
    table = markdown(list(cells.values()))
    assert "| -10.0% / -10.0% / -10.0% (1 of 3 seeds) |" in table
    whole = [*rows, row("fifo", 1, 12.0), row("fifo", 2, 8.0)]  # every seed paired: nothing added
    assert "seeds)" not in markdown(aggregate(whole))
