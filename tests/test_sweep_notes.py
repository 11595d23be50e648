"""What a sweep says beside its numbers, as a single ``simulate`` of a cell says it: ``sync``'s rows at an
active limit it does not use, and the jobs and verdicts its simulations assumed for want of a declaration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import SMOKE
from tests.conftest import REPO, write_workload
from tests.simulations import simulate_here

SWEEP = ("--sweep", "--seeds", "1", "--jobs", "1", "--no-progress")


def test_sync_rows_at_an_active_limit_above_one_say_they_ran_one_trajectory(tmp_path: Path) -> None:
    """``sync`` runs one trajectory at a time whatever ``--active`` says: its rows at 2 and 8 are one
    simulation under two labels. A single ``simulate --policy sync --max-active-trajectories 8`` warns;
    the sweep labelled its rows "active 8" without a word, in sweep.md or on stderr."""
    out = tmp_path / "s"
    swept = simulate_here(
        "--workload", SMOKE, "--output", out, *SWEEP, "--policies", "fifo,sync", "--active", "1,2,8"
    )
    assert swept.exit_code == 0, swept.output
    note = "sync runs one trajectory at a time: its rows at active 2, 8 ran with 1 active trajectory"
    assert note in (out / "sweep.md").read_text()
    warning = (
        "warning: --policies sync runs one trajectory at a time: --active 2, 8 has no effect on its rows"
    )
    assert warning in swept.stderr
    plain = simulate_here(
        "--workload", SMOKE, "--output", tmp_path / "t", *SWEEP, "--policies", "fifo,sync", "--active", "1"
    )
    assert plain.exit_code == 0, plain.output
    assert "one trajectory at a time" not in plain.stderr + (tmp_path / "t" / "sweep.md").read_text()


def test_seeds_without_jitter_say_they_repeat_one_simulation(tmp_path: Path) -> None:
    """A seed only draws the timing jitter: under ``--jitter 0`` every seed runs the same durations, so
    ``--seeds 3`` ran each cell three times alike and its min / median / max read as three samples that
    agree. Said on stderr; one seed, or a jitter, draws nothing of it."""
    args = ("--workload", SMOKE, "--sweep", "--jobs", "1", "--no-progress", "--policies", "fifo")
    repeated = simulate_here(*args, "--output", tmp_path / "a", "--seeds", "3", "--jitter", "0")
    assert repeated.exit_code == 0, repeated.output
    assert "warning: --jitter 0 draws no jitter: the 3 seeds run the same durations" in repeated.stderr
    default = simulate_here(*args, "--output", tmp_path / "b", "--jitter", "0")  # 5 seeds by default
    assert "the 5 seeds run the same durations" in default.stderr
    for other in (("--seeds", "1", "--jitter", "0"), ("--seeds", "3", "--jitter", "0.1")):
        quiet = simulate_here(*args, "--output", tmp_path / other[1], *other)
        assert quiet.exit_code == 0 and "draws no jitter" not in quiet.stderr, quiet.output


def test_a_sweep_says_what_its_simulations_assumed_as_simulate_does(tmp_path: Path) -> None:
    """A file tool without ``cpu_ms`` takes 0 s and a submission without ``passes`` passes: a single
    ``simulate`` says so on stderr; a sweep of the same workload gave tables built on those assumptions
    without a word."""
    (tmp_path / "mine.py").write_text("def work(n):\n    return sum(range(n))\n")
    tool = {"name": "work", "inputs": {"n": "int"}, "implementation": "mine.py"}
    call = {"type": "tool", "name": "work", "arguments": {"n": 5}, "latency_ms": 10}
    final = {"type": "final", "answer": "10", "latency_ms": 10}
    problems = [{"id": p, "prompt": "sum", "tools": [tool], "script": [call, final]} for p in "ab"]
    untimed = write_workload(tmp_path / "a.jsonl", problems)
    swept = simulate_here(
        "--workload", untimed, "--output", tmp_path / "s", *SWEEP, "--policies", "fifo,tool_first"
    )
    assert swept.exit_code == 0, swept.output
    assert (
        "warning: 4 CPU job(s) over the sweep's 2 simulations took 0 s (mine.py::work ×4) because their "
        "script gives no cpu_ms" in swept.stderr
    )
    lcb = REPO / "examples" / "livecodebench" / "workload.jsonl"
    n = len(lcb.read_text().splitlines())
    passed = simulate_here("--workload", lcb, "--output", tmp_path / "l", *SWEEP, "--policies", "fifo")
    assert passed.exit_code == 0, passed.output
    assert (
        f"warning: {n} submission(s) over the sweep's 1 simulations passed because their script declares no "
        "verdict" in passed.stderr
    )
    timed = [{**p, "script": [{**call, "cpu_ms": 5}, final]} for p in problems]
    quiet = simulate_here(
        "--workload", write_workload(tmp_path / "b.jsonl", timed), "--output", tmp_path / "q", *SWEEP
    )
    assert quiet.exit_code == 0, quiet.output
    assert "warning" not in quiet.stderr
    assert json.loads((tmp_path / "q" / "sweep.json").read_text())["complete"]


def test_a_stop_while_a_seeds_workload_is_written_leaves_no_workload_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a seed's jittered workload was being written left it cut short in ``workloads/`` (a
    full disk removes it, docs/SIMULATION.md): a workload that reads as whole but holds only the first
    problems, one
    ``simulate --workload OUT/workloads/seed-N.jsonl`` away from a silently smaller simulation."""
    from asyncroll.simulation import perturb
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep

    real = perturb.iter_problems

    def stopped_after_one(source: Path, limit: int | None = None) -> Iterator[Any]:
        first = next(iter(real(source, limit)))
        yield first
        raise KeyboardInterrupt

    monkeypatch.setattr(perturb, "iter_problems", stopped_after_one)
    spec = SweepSpec(("fifo",), (2,), (2,), (1,), 1, 0.2)
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SMOKE, SMOKE.parent, {}, spec, SimulationSettings(), out)
    assert list((out / "workloads").iterdir()) == []
