"""``simulate --sweep`` refuses what it cannot run before anything exists: bad lists and workloads,
single-run flags and options of the other mode, a recorded run (saying how to sweep its timings); more
``--jobs`` than usable CPUs are lowered to them with a warning."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import SMOKE
from tests.simulations import simulate_here


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
    from asyncroll.simulation import sweep, sweep_cells

    given: list[int] = []
    real_run_sweep: Callable[..., Any] = sweep.run_sweep

    def recording(*args: Any, jobs: int, **kwargs: Any) -> Any:
        given.append(jobs)
        return real_run_sweep(*args, jobs=1, **kwargs)  # the cells' processes are not this test's subject

    monkeypatch.setattr(sweep_cells, "usable_cpus", lambda: 2)
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
    shown = simulate_here("--workload", SMOKE, "--output", tmp_path / "c", "--progress")
    assert shown.exit_code == 2 and "--progress applies only with --sweep" in shown.stderr
    # --no-progress asks for nothing a single simulation would show (a script passes it to run and simulate)
    quiet = simulate_here("--workload", SMOKE, "--output", tmp_path / "d", "--no-progress")
    assert quiet.exit_code == 0, quiet.output


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


def test_a_sweep_reads_no_line_past_its_limit_as_simulate_does(tmp_path: Path) -> None:
    """``--limit N`` runs the first N problems: ``simulate`` never reads a line past them, but a sweep's
    seeded workloads were jittered from the whole file, so a bad third line failed ``--limit 2`` with
    exit 2 ("nothing created") after the output directory and its empty ``workloads/`` were made."""
    workload = tmp_path / "w.jsonl"
    workload.write_text(SMOKE.read_text().splitlines()[2] + "\n" + '{"id": "x", "prompt": 3}\n')
    single = simulate_here("--workload", workload, "--output", tmp_path / "one", "--limit", "1")
    assert single.exit_code == 0, single.output
    out = tmp_path / "sweep"
    args = ("--policies", "fifo", "--seeds", "2", "--jobs", "1", "--no-progress", "--limit", "1")
    swept = simulate_here("--sweep", "--workload", workload, "--output", out, *args)
    assert swept.exit_code == 0, swept.output
    for seed in (0, 1):  # the problems the cells ran, jittered; the same makespans as one run of each
        assert len((out / "workloads" / f"seed-{seed}.jsonl").read_text().splitlines()) == 1
    assert [row["completed"] for row in json.loads((out / "sweep.json").read_text())["rows"]] == [1, 1]


def test_a_grid_of_too_many_simulations_is_refused_before_anything_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--active 1..20 --inflight 1..20 --workers 1..20 --seeds 1000`` (24 million simulations) wrote its
    1,000 seed workloads (325 MB), then queued every cell at once with the stop signals blocked: 14 GB of
    memory within ten minutes, deaf to Ctrl-C and SIGTERM. A grid past the limit is refused, its product
    named; one at the limit runs."""
    from asyncroll.simulation import sweep

    def ran(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(sweep, "run_sweep", ran)
    many = ",".join(str(n) for n in range(1, 21))
    out = tmp_path / "huge"
    args = ("--active", many, "--inflight", many, "--workers", many, "--seeds", "1000", "--jobs", "1")
    result = simulate_here("--sweep", "--workload", SMOKE, "--output", out, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        "error: --sweep: 3 policies × 20 active × 20 inflight × 20 workers × 1000 seeds = 24,000,000 "
        "simulations; at most 100,000 in one sweep"
    ), result.stderr
    assert not out.exists()
    spec = sweep.SweepSpec(("fifo",), tuple(range(1, 101)), tuple(range(1, 11)), (1,), 100, 0.25)
    assert spec.simulations == sweep.MAX_SIMULATIONS  # at the limit: accepted
