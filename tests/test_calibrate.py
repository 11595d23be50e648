"""bench.calibrate's two judgements: the overheads it measures from a real run's events, and how it
scores a simulated ranking against real makespans with their noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.calibrate import overheads, verdicts


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_job_overhead_counts_from_when_the_job_could_have_started(tmp_path: Path) -> None:
    """Job 1 is queued on an idle worker; job 2 was queued while job 1 ran, so it could start only when
    job 1 finished: the decision and hand-off after that count, the wait behind job 1 does not."""
    workload = _write(
        tmp_path / "w.jsonl",
        [
            {"id": "a", "script": [{"latency_ms": 10}, {"latency_ms": 20}]},
            {"id": "b", "script": [{"latency_ms": 10}]},
        ],
    )
    run = tmp_path / "run"
    run.mkdir()
    events = [
        {"t": 0.011, "event": "model_finished", "id": "a", "turn": 0, "latency_s": 0.011},
        {"t": 0.012, "event": "model_finished", "id": "b", "turn": 0, "latency_s": 0.0125},
        {"t": 0.100, "event": "cpu_enqueued", "job_id": 1},
        {"t": 0.101, "event": "cpu_selected", "job_id": 1, "worker": 0},
        {"t": 0.105, "event": "cpu_enqueued", "job_id": 2},
        {"t": 0.152, "event": "cpu_finished", "job_id": 1, "execute_s": 0.050},  # 2 ms beyond execute
        {"t": 0.155, "event": "cpu_selected", "job_id": 2, "worker": 0},
        {"t": 0.190, "event": "cpu_finished", "job_id": 2, "execute_s": 0.030},  # 8 ms after job 1 ended
        {"t": 0.200, "event": "model_finished", "id": "a", "turn": 1, "latency_s": 0.0215},
    ]
    _write(run / "events.jsonl", events)
    turn_ms, job_ms = overheads(run, workload)
    assert turn_ms == pytest.approx(1.5)  # median of 1, 2.5, 1.5
    assert job_ms == pytest.approx((2 + 8) / 2)


def test_a_ranking_is_judged_only_where_reality_decides_it() -> None:
    real = {"fifo": [1.00, 1.02], "tool_first": [1.10, 1.12], "asyncroll": [1.01, 1.03]}
    lines, *counts = verdicts(real, {"fifo": 1.0, "tool_first": 1.2, "asyncroll": 0.9})
    # fifo < tool_first (agrees), fifo ~ asyncroll (overlapping ranges: a tie), asyncroll < tool_first
    assert counts == [2, 0, 0, 1]
    lines, *counts = verdicts(real, {"fifo": 1.3, "tool_first": 1.2, "asyncroll": 0.9})
    assert counts == [1, 1, 0, 1]
    assert any("CONTRADICTS" in line and line.startswith("fifo < tool_first") for line in lines)


def test_equal_simulated_makespans_do_not_contradict_a_decided_pair() -> None:
    """The simulation contradicts reality only when it orders a decided pair the other way: equal
    simulated makespans (two policies that dispatch alike) order it neither way, and were scored as a
    contradiction."""
    real = {"fifo": [1.00, 1.02], "tool_first": [1.10, 1.12]}
    lines, *counts = verdicts(real, {"fifo": 1.05, "tool_first": 1.05})
    assert counts == [0, 0, 1, 0]
    assert lines == ["fifo < tool_first real; fifo = tool_first simulated: not ordered by the simulation"]


def test_a_simulated_trajectory_that_did_not_complete_ends_the_bench_with_why(tmp_path: Path) -> None:
    """A crunch job past the 60 s tool timeout (``--cpu-ms`` allows 60,000 ms) fails its trajectory in
    simulation too; bench.calibrate and bench.draws then stopped on a bare ``AssertionError``."""
    from asyncroll.simulation.engine import SimulationSettings
    from bench import synthetic
    from bench.calibrate import simulated

    workload = synthetic.write(tmp_path / "w.jsonl", 5, 40.0, 60_000.0, seed=2)
    with pytest.raises(SystemExit) as exit_info:
        simulated(workload, "fifo", (4, 2, 1), SimulationSettings(), seed=2)
    message = str(exit_info.value.code)
    assert "the run of fifo at 4/2/1, seed 2 completed 3 of 5 trajectories (2 failed" in message
    assert "lower --cpu-ms" in message
