"""The time bases of a run's outputs agree: run.json's wall-clock times, the events' ``t``, the
durations events and summary.json carry, and the clock a summary says its durations are on."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from tests.cli_runs import load_run
from tests.conftest import tool_problem, write_workload
from tests.simulations import simulate_here


def test_a_simulations_receipt_times_are_when_it_ran_not_virtual_time(tmp_path: Path) -> None:
    """run.json's ``*_at`` times are the real wall clock. A simulation of an hour of virtual time that
    took a second said ``complete_at`` an hour after ``created_at``: in the future when it was written."""
    problems = [tool_problem("long", model_ms=1_800_000, cpu_ms=1_000)]  # 30 min, 1 s, 30 min
    workload = write_workload(tmp_path / "w.jsonl", problems)
    before = time.time()
    result = simulate_here("--workload", workload, "--output", tmp_path / "sim")
    after = time.time()
    assert result.exit_code == 0, result.output
    receipt, summary, events = load_run(tmp_path / "sim")
    assert summary["makespan_s"] == 3601.0  # virtual seconds
    stamps = {k: datetime.fromisoformat(receipt[k]) for k in ("created_at", "running_at", "complete_at")}
    for name, stamp in stamps.items():
        assert stamp.tzinfo is not None, name
        assert before - 0.001 <= stamp.timestamp() <= after + 0.001, (name, receipt[name])
    [started] = [e for e in events if e.event == "measurement_started"]
    assert before <= started.wall_time <= after
