"""summary.json's own arithmetic on hand-made event streams: the phase breakdown, correlations, rates."""

from __future__ import annotations

from typing import Any

from asyncroll.events import (
    CpuFailed,
    CpuFinished,
    CpuSelected,
    Event,
    ModelFailed,
    ModelFinished,
    ModelStarted,
    TrajectoryFinished,
    TrajectoryStarted,
)
from asyncroll.outputs.statistics import pearson
from asyncroll.outputs.summary import SummaryBuilder

LIMITS = {"max_active_trajectories": 2, "max_inflight_model_requests": 2, "cpu_workers": 1}


def summarise(events: list[Event]) -> dict[str, Any]:
    builder = SummaryBuilder()
    for event in events:
        builder(event)
    return builder.build(
        makespan_s=20.0, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
    )


def selected(tid: str, job: int, waited: float) -> CpuSelected:
    return CpuSelected(
        id=tid,
        job_id=job,
        worker=0,
        policy="fifo",
        reason="fifo",
        queue_depth=1,
        model_outstanding=0,
        waited_s=waited,
        oldest_job_id=job,
        reordered=False,
    )


def test_phases_cover_failed_work_and_only_finished_trajectories() -> None:
    """A timed-out job and a failed model request are time the trajectory spent (they were left out:
    0.0 s of execution for a run whose every job timed out), and an unfinished trajectory's waits are
    not in a breakdown whose denominator is finished trajectories' time (fractions summed to ~2)."""
    events: list[Event] = [
        TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1),
        TrajectoryStarted(id="b", index=1, prompt_chars=1, active=2),
        ModelStarted(id="a", request_id=1, turn=0, inflight=1, queued_s=0.5),
        ModelFinished(id="a", request_id=1, turn=0, latency_s=2.0, action="tool"),
        ModelStarted(id="b", request_id=2, turn=0, inflight=1, queued_s=9.0),  # b never finishes
        ModelFailed(id="b", request_id=2, turn=0, latency_s=4.0, kind="timeout", error="x"),
        selected("a", 1, 0.25),
        CpuFailed(
            id="a", job_id=1, worker=0, kind="tool", tool="t", reason="timeout", roundtrip_s=3.0, error="x"
        ),
        ModelStarted(id="a", request_id=3, turn=1, inflight=1, queued_s=0.0),
        ModelFailed(id="a", request_id=3, turn=1, latency_s=1.0, kind="invalid_action", error="x"),
        selected("a", 2, 0.0),
        CpuFinished(
            id="a",
            job_id=2,
            worker=0,
            kind="grade",
            tool="__grade__",
            ok=True,
            execute_s=0.5,
            cpu_s=None,
            roundtrip_s=0.6,
        ),
        TrajectoryFinished(id="a", status="failed", turns=2, tool_calls=1, duration_s=8.0),
    ]
    phases = summarise(events)["phases"]
    assert phases["model_queue_s"] == 0.5 and phases["model_service_s"] == 3.0
    assert phases["cpu_queue_s"] == 0.25 and phases["cpu_execute_s"] == 3.5
    assert phases["trajectory_total_s"] == 8.0
    assert sum(phases["fractions_of_trajectory_time"].values()) <= 1.0
    assert phases["fractions_of_trajectory_time"]["cpu_execute_s"] == 3.5 / 8.0


def test_a_correlation_of_equal_values_is_missing_not_zero() -> None:
    """37 equal execute times: the float error of their mean passed for variance, and r read 0.0."""
    import math

    equal = [math.log(0.05)] * 37
    assert pearson(equal, [math.log(0.05 + i / 1000) for i in range(37)]) is None
    assert pearson([math.log(0.05 + i / 1000) for i in range(37)], equal) is None
    assert pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.5]) == 0.9979


def test_cancelled_tool_calls_are_not_in_the_error_rate() -> None:
    """Two calls ended in errors and two were cancelled when the run stopped: the rate over calls with
    an outcome is 1.0 (it read 0.5, the cancelled calls counting as successes)."""
    events: list[Event] = [
        TrajectoryStarted(id=t, index=i, prompt_chars=1, active=1) for i, t in enumerate("ab")
    ]
    for job, tid in enumerate("ab"):
        events.append(
            CpuFinished(
                id=tid,
                job_id=job,
                worker=0,
                kind="tool",
                tool="t",
                ok=False,
                execute_s=0.1,
                cpu_s=None,
                roundtrip_s=0.1,
                error="boom",
            )
        )
        events.append(
            CpuFailed(
                id=tid,
                job_id=10 + job,
                worker=0,
                kind="tool",
                tool="t",
                reason="cancelled",
                roundtrip_s=0.1,
                error="stopped",
            )
        )
    tools = summarise(events)["tools"]
    assert tools["calls"] == 4 and tools["errors"] == 2 and tools["failures"] == {"cancelled": 2}
    assert tools["error_rate"] == 1.0
