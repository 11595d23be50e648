"""Stop signals and what a stopped `--jobs` sweep keeps: a simulation that finished while an earlier one
still ran is one of the sweep's finished simulations too. Real cell processes, each with a hard timeout."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tool_problem, write_workload
from tests.simulations import wait_until


class _HoldsSeed0:
    """A custom arm that never finishes (the sweep kills it). Seed 1's marks that it started: its cell
    process took it after finishing ``fifo``'s seed-1 cell, so that one has finished. Seed 0's waits for
    that mark, then stops the sweep with Ctrl-C's signal, while the sweep waits on this very cell."""

    name = "fifo"

    def __init__(self, seed: int, mark: Path) -> None:
        self.seed, self.mark = seed, mark

    def choose(self, snapshot: Any) -> Any:
        if self.seed == 1:
            self.mark.touch()
        else:
            wait_until(self.mark.exists, "seed 1's held cell", timeout=600)
            os.kill(os.getppid(), signal.SIGINT)  # the sweep's process
        wait_until(lambda: False, "the sweep to end this cell", timeout=600)  # killed by the sweep


@pytest.mark.timeout(120)
def test_a_stopped_jobs_sweep_keeps_a_simulation_that_finished_after_a_running_one(tmp_path: Path) -> None:
    """`--jobs 2`: Ctrl-C while an early cell still ran threw away the cells after it that had finished
    (results came back in order: only the finished prefix was written), so "the rows of the simulations
    that finished are written" was false, and a stop before the first cell's end removed everything."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepInterrupted, SweepSpec, run_sweep

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo",), (2,), (2,), (1,), 2, 0.2)  # cells: fifo 0, held 0, fifo 1, held 1
    mark = tmp_path / "seed-1-held"

    def held(seeded: Path) -> Any:
        return _HoldsSeed0(int(seeded.stem.split("-")[1]), mark)

    out = tmp_path / "s"
    shown: list[tuple[int, int, str, int]] = []  # the progress line's cells, each as it is kept
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SweepInterrupted) as stopped:
            run_sweep(
                workload, tmp_path, {}, spec, SimulationSettings(), out, custom={"held": held}, jobs=2,
                progress=lambda done, total, row: shown.append((done, total, row["policy"], row["seed"])),
            )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (stopped.value.done, stopped.value.total) == (2, 4)
    assert shown == [(1, 4, "fifo", 0), (2, 4, "fifo", 1)]  # the kept one shown too, not only the first
    with (out / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["policy"], r["seed"]) for r in rows] == [("fifo", "0"), ("fifo", "1")]
    document = json.loads((out / "sweep.json").read_text())
    assert document["complete"] is False and document["simulations"] == {"done": 2, "total": 4}
    assert (out / "sweep.md").read_text().startswith("**Partial: stopped by SIGINT after 2 of 4")
    assert not list(out.glob(".*.tmp"))
    import multiprocessing

    assert not multiprocessing.active_children()
