"""summary.json's ``client_cpu_blocked`` section and the seconds it is read against, on one trajectory
with hand-stamped times: the fraction of the makespan is given (never null in a measured run) and every
duration is rounded to the microsecond."""

from __future__ import annotations

from typing import Any

from asyncroll.events import (
    ModelEnqueued,
    ModelFinished,
    TrajectoryFinished,
    TrajectoryStarted,
)
from asyncroll.outputs.summary import SummaryBuilder
from tests.event_records import at, cpu_enqueued, cpu_finished

LIMITS = {"max_active_trajectories": 1, "max_inflight_model_requests": 1, "cpu_workers": 1}


def _summary(makespan_s: float) -> dict[str, Any]:
    """A model turn 0-1 s, a tool job 1-1.1234567 s (blocked: nothing for the model), a final turn."""
    job = cpu_finished(execute_s=0.1, roundtrip_s=0.1234567)
    events = [
        at(0.0, TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1)),
        at(0.0, ModelEnqueued(id="a", request_id=1, turn=0, outstanding=1)),
        at(1.0, ModelFinished(id="a", request_id=1, turn=0, latency_s=1.0, action="tool")),
        at(1.0, cpu_enqueued()),
        at(1.1234567, job),
        at(1.1234567, ModelEnqueued(id="a", request_id=2, turn=1, outstanding=1)),
        at(2.0000014, ModelFinished(id="a", request_id=2, turn=1, latency_s=0.8765447, action="final")),
        at(
            2.0000014,
            TrajectoryFinished(id="a", status="completed", turns=2, tool_calls=1, duration_s=2.0000014),
        ),
    ]
    builder = SummaryBuilder()
    for event in events:
        builder(event)
    return builder.build(
        makespan_s=makespan_s, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
    )


def test_blocked_seconds_fraction_and_intervals() -> None:
    blocked = _summary(2.0000014)["client_cpu_blocked"]
    assert (blocked["seconds"], blocked["intervals"]) == (0.123457, 1)
    assert blocked["fraction_of_makespan"] == round(0.123457 / 2.0000014, 6) == 0.061728


def test_the_seconds_it_is_read_against_are_rounded_to_the_microsecond() -> None:
    summary = _summary(2.0000014)
    assert summary["makespan_s"] == 2.000001
    assert summary["phases"]["trajectory_total_s"] == 2.000001
    assert summary["latency"]["cpu_dispatch_overhead_s"]["max"] == 0.023457  # 0.1234567 − 0.1


def test_a_window_shorter_than_its_microsecond_is_the_empty_window_it_is_reported_as() -> None:
    """A makespan that rounds to 0.0 (a simulation of one 0.2 µs turn) is the empty window summary.json
    says it is: no per-hour rate over it (18 billion an hour, beside ``makespan_s`` 0.0), no fraction of it,
    as the efficiency already was (it is read against the makespan as reported)."""
    builder = SummaryBuilder()
    for event in (
        at(0.0, TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1)),
        at(0.0, ModelEnqueued(id="a", request_id=1, turn=0, outstanding=1)),
        at(2e-7, ModelFinished(id="a", request_id=1, turn=0, latency_s=0.0, action="final")),
        at(2e-7, TrajectoryFinished(id="a", status="completed", turns=1, tool_calls=0, duration_s=0.0)),
    ):
        builder(event)
    summary = builder.build(
        makespan_s=2e-7,
        policy="fifo",
        limits=LIMITS,
        cpu_cost={},
        peaks={},
        status="complete",
        dedicated_gpu=True,
    )
    assert summary["makespan_s"] == 0.0
    throughput = summary["throughput"]
    assert throughput["completed_per_wall_hour"] is None
    assert throughput["trajectories_per_wall_hour"] is None
    assert throughput["per_wall_hour_reason"] == "the measured window is empty (makespan 0)"
    assert throughput["completed_per_gpu_hour"] is None
    assert summary["client_cpu_blocked"]["fraction_of_makespan"] is None
    assert summary["bounds"]["efficiency"] is None
