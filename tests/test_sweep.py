"""Sweeps and the seeded timing jitter they rest on."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncroll.simulation.perturb import factor, perturb_workload
from tests.children import end
from tests.cli_runs import SMOKE, cli
from tests.conftest import REPO, tool_problem, write_workload
from tests.test_simulation import signal_and_wait, simulate_here, start_slow_cli, wait_until


def test_jitter_is_deterministic_mean_one_and_keyed() -> None:
    draws = [factor(3, f"p{i}", 0, "cpu", 0.5) for i in range(4000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.03)
    assert draws == [factor(3, f"p{i}", 0, "cpu", 0.5) for i in range(4000)]
    assert factor(3, "p0", 0, "cpu", 0.5) != factor(4, "p0", 0, "cpu", 0.5)
    assert factor(3, "p0", 0, "cpu", 0.5) != factor(3, "p0", 0, "model", 0.5)
    assert factor(9, "anything", 2, "cpu", 0.0) == 1.0


def test_perturbed_workload_keeps_actions_and_sets_costs(tmp_path: Path) -> None:
    source = write_workload(tmp_path / "w.jsonl", [tool_problem("a", model_ms=100, cpu_ms=50, turns=2)])
    same = tmp_path / "same.jsonl"
    perturb_workload(source, same, seed=0, sigma=0.0)
    row = json.loads(same.read_text())
    assert [a["latency_ms"] for a in row["script"]] == [100, 100, 100]
    assert [a.get("cpu_ms") for a in row["script"]] == [50, 50, None]  # sleep_ms argument → cpu_ms
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=1, sigma=0.5)
    row = json.loads(jittered.read_text())
    assert row["script"][0]["arguments"] == {"milliseconds": 50}
    assert row["script"][0]["latency_ms"] != 100 and row["script"][0]["cpu_ms"] != 50


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
    lines = result.stderr.splitlines()  # --progress off a terminal: one plain line per cell, in order
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


def test_sweep_refuses_bad_lists_and_workloads(tmp_path: Path) -> None:
    missing = simulate_here("--sweep", "--workload", tmp_path / "nope.jsonl", "--output", tmp_path / "m")
    assert missing.exit_code == 2 and "cannot read" in missing.stderr and not (tmp_path / "m").exists()
    bad = simulate_here("--sweep", "--workload", SMOKE, "--output", tmp_path / "s", "--active", "2,x")
    assert bad.exit_code == 2 and "--active" in bad.stderr and not (tmp_path / "s").exists()
    policy = simulate_here(
        "--sweep", "--workload", SMOKE, "--output", tmp_path / "t", "--policies", "fifo,lifo"
    )
    assert policy.exit_code == 2 and not (tmp_path / "t").exists()
    jobs = simulate_here("--sweep", "--workload", SMOKE, "--output", tmp_path / "j", "--jobs", "-1")
    assert jobs.exit_code == 2 and "--jobs" in jobs.stderr and not (tmp_path / "j").exists()


def test_more_jobs_than_usable_cpus_are_lowered_to_them_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--jobs 64`` on a 2-CPU machine started 64 cell processes (≈ 140 MB each) fighting for 2 CPUs."""
    from asyncroll.simulation import sweep

    given: list[int] = []
    real_run_sweep: Callable[..., Any] = sweep.run_sweep

    def recording(*args: Any, jobs: int, **kwargs: Any) -> Any:
        given.append(jobs)
        return real_run_sweep(*args, jobs=1, **kwargs)  # the cells' processes are not this test's subject

    monkeypatch.setattr(sweep, "usable_cpus", lambda: 2)
    monkeypatch.setattr(sweep, "run_sweep", recording)
    args = ("--sweep", "--workload", SMOKE, "--policies", "fifo", "--seeds", "1")
    many = simulate_here(*args, "--output", tmp_path / "many", "--jobs", "64")
    assert many.exit_code == 0, many.output
    assert "warning: --jobs 64: this process may use 2 CPU(s); running 2 cells at once" in many.stderr
    fits = simulate_here(*args, "--output", tmp_path / "fits", "--jobs", "2")
    default = simulate_here(*args, "--output", tmp_path / "default")
    assert fits.exit_code == 0 and default.exit_code == 0 and "warning" not in fits.stderr + default.stderr
    assert given == [2, 2, 2]


def test_options_of_one_mode_are_refused_outside_it(tmp_path: Path) -> None:
    """A sweep option without --sweep, or a batching-server option with the fixed-latency server, would
    be silently ignored: it is an error that names the options, and nothing runs."""
    single = simulate_here("--workload", SMOKE, "--output", tmp_path / "a", "--seeds", "3", "--jobs", "2")
    assert single.exit_code == 2 and "--seeds, --jobs apply only with --sweep" in single.stderr
    fixed = simulate_here("--workload", SMOKE, "--output", tmp_path / "b", "--max-num-seqs", "8")
    assert fixed.exit_code == 2 and "--max-num-seqs applies only with --server batching" in fixed.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


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
    one as if it were a result."""
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
    with pytest.raises(SimulationError, match=r"sweep cell broken at 4 / 4 / 1, seed 0: .*ended failed.*"):
        run_sweep(
            workload, tmp_path, {}, spec, SimulationSettings(), tmp_path / "s", {"broken": lambda _: Broken()}
        )
    assert not (tmp_path / "s" / "sweep.csv").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "tool_first"], "--policy does not apply with --sweep (use --policies"),
        (
            ["--max-active-trajectories", "8"],
            "--max-active-trajectories does not apply with --sweep (use --active",
        ),
        (["--max-inflight-model-requests", "2"], "does not apply with --sweep (use --inflight"),
        (
            ["--cpu-workers", "2", "--workers", "1"],
            "--cpu-workers does not apply with --sweep (use --workers",
        ),
        (["--active", "0", "--seeds", "1", "--jobs", "1"], "--active: every value must be an integer >= 1"),
        (["--inflight", "-1"], "--inflight: every value must be an integer >= 1"),
        (["--workers", "0,2"], "--workers: every value must be an integer >= 1"),
        (["--active", "8,,4"], "--active: empty item in '8,,4'"),
        (["--active", ",8"], "--active: empty item"),
        (["--workers", "2,"], "--workers: empty item"),
        (["--policies", ""], "--policies: empty item"),
        (["--policies", "fifo,fifo", "--seeds", "2"], "--policies: fifo given more than once"),
        (["--active", "4,4"], "--active: 4 given more than once"),
        (["--policies", "fifo,lifo"], "--policies: 'lifo': Input should be"),
        (["--workers", "2,20000"], "--workers 20000: at most 10240 simulated workers"),
        (["--jobs", "0"], "--jobs: must be >= 1"),
        (["--jobs", "-1"], "--jobs: must be >= 1"),
        (["--seeds", "0"], "--seeds: must be from 1 to 1000, got 0"),
        # each seed writes its jittered workload before any cell runs: 10**9 wrote them for days
        (["--seeds", "1000000000"], "--seeds: must be from 1 to 1000, got 1000000000"),
    ],
)
def test_sweep_refuses_bad_lists_and_single_run_forms_before_anything_exists(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """A single-run flag would be ignored (the sweep takes its lists); a bad list value used to fail in
    the first cell, naming the single-run flag, after the seeds' workloads were written; an empty item
    was skipped and a repeated value ran its cells twice, counted as more seeds."""
    out = tmp_path / "sweep"
    result = simulate_here("--sweep", "--workload", SMOKE, "--output", out, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.startswith("error: ")
    assert not out.exists()


@pytest.mark.timeout(60)
def test_sweep_json_records_what_produced_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncroll.outputs.receipt import file_sha256, versions

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
    assert record["command"] == argv
    assert [r["completed"] for r in record["rows"]] == [2]


@pytest.mark.timeout(90)
def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM used to kill the sweep outright; now, as on Ctrl-C, the running cell is cancelled, the
    rest never start, no table is written and the exit code is 130."""
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=10, turns=2) for i in range(40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "sweep"
    args: list[str | Path] = ["--workload", workload, "--output", out, "--policies", "fifo,sync"]
    args += ["--seeds", "2", "--jobs", "1"]
    proc = start_slow_cli(tmp_path, "simulate", "--sweep", *args, "--progress")
    try:
        wait_until(lambda: (out / "workloads" / "seed-1.jsonl").exists(), "the sweep start")
        stderr = signal_and_wait(proc, signal.SIGTERM)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert f"interrupted by SIGTERM; partial outputs in {out}" in stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr
    assert not (out / "sweep.csv").exists()


@pytest.mark.timeout(90)
def test_cell_processes_end_when_the_sweep_is_killed_outright(tmp_path: Path) -> None:
    """Cell processes ignore SIGTERM (the sweep stops them) and hold both ends of their task queue, so a
    sweep killed outright (SIGKILL, the OOM killer) used to leave them running forever. They watch the
    sweep and end with it."""
    import psutil

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=10, turns=2) for i in range(40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        tmp_path / "sweep",
        "--policies",
        "fifo,sync",
    ]
    proc = start_slow_cli(tmp_path, "simulate", "--sweep", *args, "--seeds", "2", "--jobs", "2")

    def cells() -> list[psutil.Process]:
        found = []
        for child in sweep.children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                pass
        return found

    children: list[psutil.Process] = []
    try:
        sweep = psutil.Process(proc.pid)  # in the try: should it raise, the Popen is still ended
        wait_until(lambda: len(cells()) >= 2, "two cell processes")
        children = sweep.children(recursive=True)
        proc.kill()
        proc.communicate(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, [c.pid for c in alive]
    finally:
        end(proc)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def test_jitter_scales_declared_output_tokens_with_the_model_latency(tmp_path: Path) -> None:
    """The batching server model times a turn by its tokens: jittering only latency_ms left it the same
    turns on every seed."""
    problem = tool_problem("a", model_ms=100, cpu_ms=50, turns=2)
    for action, tokens in zip(problem["script"], (40, 3, 1), strict=True):
        action["output_tokens"] = tokens
    problem["script"].append({"type": "final", "answer": 1})  # neither latency nor tokens: untouched
    source = write_workload(tmp_path / "w.jsonl", [problem])
    same = tmp_path / "same.jsonl"
    perturb_workload(source, same, seed=0, sigma=0.0)
    assert [a.get("output_tokens") for a in json.loads(same.read_text())["script"]] == [40, 3, 1, None]
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=2, sigma=0.8)
    script = json.loads(jittered.read_text())["script"]
    for turn, (tokens, action) in enumerate(zip((40, 3, 1), script[:3], strict=True)):
        f = factor(2, "a", turn, "model", 0.8)
        assert action["latency_ms"] == pytest.approx(100 * f)
        assert action["output_tokens"] == max(1, round(tokens * f))
    assert script[3].get("output_tokens") is None and script[3].get("latency_ms") is None


def test_a_sweep_cell_reruns_from_its_seeds_workload_and_the_recorded_tool_root(tmp_path: Path) -> None:
    """As README says: ``simulate --workload OUT/workloads/seed-N.jsonl --tool-root <sweep.json's
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


def test_an_interrupted_sweep_keeps_the_simulations_it_finished(tmp_path: Path) -> None:
    """Ctrl-C between cells (here: raised by the progress callback after the second row, as the signal's
    KeyboardInterrupt would be) used to throw every finished row away: now they are written, marked
    partial, and the interruption says how many finished."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepInterrupted, SweepSpec, run_sweep

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo", "tool_first"), (2, 4), (2,), (1,), 2, 0.2)

    def stop_after_two(done: int, total: int, row: dict[str, object]) -> None:
        if done == 2:
            raise KeyboardInterrupt("SIGINT")

    out = tmp_path / "s"
    with pytest.raises(SweepInterrupted) as stopped:
        run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out, progress=stop_after_two)
    assert (stopped.value.done, stopped.value.total) == (2, 8)
    with (out / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["policy"], r["active"], r["seed"]) for r in rows] == [("fifo", "2", "0"), ("fifo", "4", "0")]
    document = json.loads((out / "sweep.json").read_text())
    assert document["complete"] is False and document["simulations"] == {"done": 2, "total": 8}
    assert document["stopped_by"] == "SIGINT" and len(document["rows"]) == 2
    assert (out / "sweep.md").read_text().startswith("**Partial: stopped by SIGINT after 2 of 8")
    assert not list(out.glob(".*.tmp"))
    whole = tmp_path / "whole"
    run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), whole)
    document = json.loads((whole / "sweep.json").read_text())
    assert document["complete"] is True and document["simulations"] == {"done": 8, "total": 8}
    assert document["stopped_by"] is None
    assert document["rows"][:2] == json.loads((out / "sweep.json").read_text())["rows"]


STOP_CELLS = """
import sys, time, os
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

from asyncroll.simulation import sweep

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), sweep._cell_process, (os.getpid(),))
    pool.submit(time.sleep, 600)  # a long cell; cell processes ignore SIGINT and SIGTERM
    while not pool._processes:
        time.sleep(0.01)
    (cell,) = pool._processes.values()
    shutdown, calls = pool.shutdown, []

    def interrupted_once(*args, **kwargs):  # the second Ctrl-C, while the sweep waits for the cell
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return shutdown(*args, **kwargs)

    pool.shutdown = interrupted_once
    began = time.monotonic()
    sweep._stop(pool, kill=False)
    print(len(calls), cell.exitcode, round(time.monotonic() - began, 1))
"""


@pytest.mark.timeout(60)
def test_a_signal_while_the_sweep_waits_for_its_cells_kills_them(tmp_path: Path) -> None:
    """A Ctrl-C that cut the sweep's wait for its running cells short left them running (they ignore
    signals) and the interpreter's exit waiting on them for ever; now it kills them and the wait ends."""
    script = tmp_path / "stop_cells.py"
    script.write_text(STOP_CELLS)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    calls, exitcode, seconds = out.stdout.split()
    assert calls == "2" and exitcode == str(-signal.SIGKILL)
    assert float(seconds) < 30


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


def test_jitter_scales_a_submissions_declared_evaluation_cost(tmp_path: Path) -> None:
    """A ``submit`` may declare its evaluation's ``cpu_ms`` (a replay workload of a code run does, for
    every program): only tool actions' costs were jittered, so every seed evaluated each program in the
    same time and a sweep's spread left out the CPU side of a code workload."""
    problem = {
        "id": "c",
        "prompt": "write it",
        "script": [
            {"type": "submit", "code": "print(1)", "latency_ms": 10, "cpu_ms": 400, "passes": False},
            {"type": "submit", "code": "print(2)", "latency_ms": 10, "cpu_ms": 250},
            {"type": "submit", "code": "print(3)", "latency_ms": 10},  # no cost declared: none invented
        ],
        "metadata": {"prompt_metadata": {"protocol": "one_repair", "max_generations": 3}},
    }
    source = write_workload(tmp_path / "w.jsonl", [problem])
    same = tmp_path / "same.jsonl"
    perturb_workload(source, same, seed=0, sigma=0.0)
    assert [a.get("cpu_ms") for a in json.loads(same.read_text())["script"]] == [400, 250, None]
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=3, sigma=0.5)
    script = json.loads(jittered.read_text())["script"]
    for turn, cost in enumerate((400, 250)):
        assert script[turn]["cpu_ms"] == pytest.approx(cost * factor(3, "c", turn, "cpu", 0.5))
        assert script[turn]["cpu_ms"] != cost
    assert script[2].get("cpu_ms") is None
    assert [a.get("passes") for a in script] == [False, None, None]


def test_a_jittered_duration_is_capped_at_a_day_not_refused(tmp_path: Path) -> None:
    """A valid long job (80 000 s of a one-day limit) jittered past one day made the seed's workload
    invalid: the sweep stopped with "cpu_ms: Input should be less than or equal to 86400000" about a
    file it wrote itself. Jittered durations are capped at the limit of a declared one."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep
    from asyncroll.workload import MAX_DURATION_MS

    long = 80_000_000.0
    problems = [tool_problem(f"p{i}", model_ms=long, cpu_ms=long, turns=1) for i in range(6)]
    source = write_workload(tmp_path / "w.jsonl", problems)
    jittered = tmp_path / "j.jsonl"
    perturb_workload(source, jittered, seed=0, sigma=1.0)
    costs = [
        (a.get("latency_ms"), a.get("cpu_ms"))
        for line in jittered.read_text().splitlines()
        for a in json.loads(line)["script"]
    ]
    assert all(c is None or c <= MAX_DURATION_MS for pair in costs for c in pair)
    assert any(MAX_DURATION_MS in pair for pair in costs)  # some were drawn past a day
    spec = SweepSpec(("fifo",), (4,), (4,), (2,), 2, 1.0)
    rows = run_sweep(
        source,
        tmp_path,
        {"tool_timeout": 2 * MAX_DURATION_MS / 1000},
        spec,
        SimulationSettings(),
        tmp_path / "s",
    )
    assert [r["completed"] for r in rows] == [6, 6]


def test_a_sweep_of_a_recorded_run_is_refused_saying_how_to_sweep_its_timings(tmp_path: Path) -> None:
    """``--sweep --from-run RUN`` said only "--sweep needs --workload"; the way there (sweep a replay's
    workload, with the run's tool root, since the replay workload's folder holds no tool files) works."""
    recorded = tmp_path / "recorded"
    assert simulate_here("--workload", SMOKE, "--output", recorded).exit_code == 0
    sweep = ("--sweep", "--policies", "fifo", "--seeds", "1", "--jobs", "1")
    refused = simulate_here(*sweep, "--from-run", recorded, "--output", tmp_path / "s")
    assert refused.exit_code == 2 and "sweep REPLAY/replay-workload.jsonl" in refused.stderr, refused.output
    assert not (tmp_path / "s").exists()
    replay = tmp_path / "replay"
    assert simulate_here("--from-run", recorded, "--output", replay).exit_code == 0
    root = json.loads((replay / "run.json").read_text())["config"]["tool_root"]
    workload = replay / "replay-workload.jsonl"
    swept = simulate_here(*sweep, "--workload", workload, "--tool-root", root, "--output", tmp_path / "s")
    assert swept.exit_code == 0, swept.output


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
