"""summary.json's counts, rates and scheduler diagnostics on one hand-made event stream whose every
number is worked out by hand in the comments: each field a user reads is pinned to its definition
(MEASUREMENT.md), so a changed comparison, sign or denominator shows here."""

from __future__ import annotations

from typing import Any

from asyncroll.events import (
    CpuEnqueued,
    CpuFailed,
    CpuFinished,
    CpuSelected,
    Event,
    JobKind,
    ModelFailed,
    ModelFinished,
    ModelRetrying,
    TrajectoryFinished,
    TrajectoryStarted,
    WorkerRestarting,
)
from asyncroll.outputs.summary import SummaryBuilder
from tests.event_records import cpu_enqueued, cpu_failed, cpu_finished, cpu_selected

LIMITS = {"max_active_trajectories": 4, "max_inflight_model_requests": 2, "cpu_workers": 2}


def _selected(
    tid: str, job: int, waited: float, reason: str, eligible: bool, reordered: bool, source: str | None
) -> CpuSelected:
    return cpu_selected(
        tid,
        job,
        policy="asyncroll",
        reason=reason,
        queue_depth=3,
        waited_s=waited,
        reordered=reordered,
        eligible=eligible,
        predicted_s=None if source is None else 0.1 * job,
        prediction_source=source,
    )


def _finished(tid: str, job: int, kind: JobKind, ok: bool, execute: float, roundtrip: float) -> CpuFinished:
    error = None if ok else "boom"
    return cpu_finished(tid, job, kind=kind, ok=ok, execute_s=execute, roundtrip_s=roundtrip, error=error)


def _failed(tid: str, job: int, kind: JobKind, reason: Any) -> CpuFailed:
    return cpu_failed(tid, job, kind=kind, reason=reason, roundtrip_s=1.0)


def _enqueued(tid: str, job: int, resubmission: bool = False) -> CpuEnqueued:
    return cpu_enqueued(tid, job, resubmission=resubmission)


def _stream() -> list[Event]:
    """Four trajectories: a completed and correct (referenced), b failed before grading (referenced),
    c a code problem that hit max_turns after its repair passed, d never finished."""
    events: list[Event] = [
        TrajectoryStarted(id=t, index=i, prompt_chars=1, active=i + 1) for i, t in enumerate("abcd")
    ]
    for rid, reason in enumerate(("stop", "length", None)):
        events.append(
            ModelFinished(
                id="a", request_id=rid, turn=rid, latency_s=1.0, action="tool", finish_reason=reason
            )
        )
    for rid, kind in enumerate(("invalid_action", "bad_response", "timeout", "cancelled"), 10):
        events.append(ModelFailed(id="b", request_id=rid, turn=0, latency_s=1.0, kind=kind, error="x"))
    for attempt in (1, 2):
        events.append(ModelRetrying(id="b", turn=0, attempt=attempt, kind="timeout", delay_s=0.1, error="x"))
    # decisions: 4; eligible: jobs 2, 3, 4; reordered: job 2 (and job 1, not eligible)
    events += [
        _enqueued("a", 1),
        _selected("a", 1, 0.1, "hard_starvation_fifo", False, True, None),
        _finished("a", 1, "tool", True, 0.5, 0.6),
        _enqueued("a", 2, resubmission=True),
        _selected("a", 2, 0.3, "low_model_supply_predicted_unlock", True, True, "model"),
        _finished("a", 2, "tool", True, 0.2, 0.25),
        _enqueued("b", 3),
        _selected("b", 3, 0.2, "tail_critical_path", True, False, "model"),
        _finished("b", 3, "tool", False, 0.1, 0.09),  # the tool raised (and a round trip under execute)
        _enqueued("c", 4),
        _selected("c", 4, 0.4, "tail_critical_path", True, False, "prior"),
        _failed("c", 4, "tool", "timeout"),
        _failed("c", 5, "evaluate", "worker_died"),
        _finished("a", 6, "grade", True, 0.001, 0.002),
        _failed("d", 7, "tool", "cancelled"),
    ]
    events += [
        WorkerRestarting(worker=0, old_pid=1, generation=1, reason="timeout", restarts=1),
        WorkerRestarting(worker=1, old_pid=2, generation=1, reason="died", restarts=2),
        WorkerRestarting(worker=0, old_pid=3, generation=2, reason="timeout", restarts=3),
    ]
    events += [
        TrajectoryFinished(
            id="a",
            status="completed",
            turns=3,
            tool_calls=2,
            duration_s=10.0,
            correct=True,
            has_reference=True,
            observations_cut=1,
        ),
        TrajectoryFinished(
            id="b", status="failed", turns=1, tool_calls=1, duration_s=4.0, has_reference=True
        ),
        TrajectoryFinished(
            id="c",
            status="max_turns",
            turns=4,
            tool_calls=1,
            duration_s=6.0,
            correct=True,
            generations=3,
            observations_cut=2,
        ),
    ]
    return events


def _summary(makespan_s: float | None = 20.0) -> dict[str, Any]:
    builder = SummaryBuilder()
    for event in _stream():
        builder(event)
    return builder.build(
        makespan_s=makespan_s,
        policy="asyncroll",
        limits=LIMITS,
        cpu_cost={},
        peaks={"queued_cpu_jobs": 5},
        status="complete",
    )


def test_counts_rates_and_throughput() -> None:
    summary = _summary()
    assert summary["counts"] == {
        "trajectories": 4,
        "finished": 3,
        "completed": 1,
        "failed": 1,
        "max_turns": 1,
        "unfinished": 1,
    }
    # 1 completed of 4 started; 3 valid of 5 received (2 invalid; the timeout and the cancel are not)
    assert summary["rates"] == {"success_rate": 0.25, "validity_rate": 0.6, "validity_denominator": 5}
    throughput = summary["throughput"]  # 20 s: 1/180 h
    assert (throughput["completed_per_wall_hour"], throughput["trajectories_per_wall_hour"]) == (180.0, 540.0)
    assert summary["makespan_s"] == 20.0 and summary["schema_version"] == 1


def test_accuracy_counts_graded_and_referenced_apart() -> None:
    accuracy = _summary()["accuracy"]
    # graded: a and c (both correct); b ungraded; referenced: a (correct) and b (failed before grading)
    assert (accuracy["exact"], accuracy["correct"], accuracy["denominator"], accuracy["ungraded"]) == (
        1.0,
        2,
        2,
        1,
    )
    assert (accuracy["exact_of_referenced"], accuracy["referenced"]) == (0.5, 2)
    # c's third program still counts as its repair (after the one repair: generations capped at 2)
    assert accuracy["one_repair"] == {
        "evaluated": 1,
        "passed_first": 0,
        "repairs_attempted": 1,
        "passed_after_repair": 1,
        "pass_rate_first": 0.0,
        "pass_rate_final": 1.0,
        "repair_success_rate": 1.0,
    }


def test_model_tools_and_workers() -> None:
    summary = _summary()
    model = summary["model"]
    assert (model["requests"], model["finished"]) == (7, 3)
    assert model["finish_reasons"] == {"stop": 1, "length": 1}
    assert model["failed"] == {"invalid_action": 1, "bad_response": 1, "timeout": 1, "cancelled": 1}
    assert model["retries"] == {"timeout": 2}
    tools = summary["tools"]
    # tool calls: jobs 1, 2, 3 (raised), 4 (timed out), 7 (cancelled: no outcome) → 2 of 4 with an outcome
    assert (tools["calls"], tools["errors"], tools["error_rate"]) == (5, 1, 0.5)
    assert tools["calls_per_trajectory"] == round(4 / 3, 6)  # 2 + 1 + 1 calls over 3 finished
    assert tools["failures"] == {"timeout": 1, "worker_died": 1, "cancelled": 1}
    assert tools["jobs_by_kind"] == {"tool": 5, "evaluate": 1, "grade": 1}
    assert tools["observations_cut"] == 3
    assert summary["workers"] == {"restarts": 3, "restarts_by_reason": {"timeout": 2, "died": 1}}


def test_latency_distributions() -> None:
    latency = _summary()["latency"]
    # waits 0.1, 0.2, 0.3, 0.4: p50 between the middle two, p95 at rank 2.85 → 0.3 + 0.85 × 0.1
    assert latency["cpu_queue_s"] == {
        "count": 4,
        "mean": 0.25,
        "min": 0.1,
        "p50": 0.25,
        "p95": 0.385,
        "max": 0.4,
    }
    # round trip − execute, never below 0: 0.1, 0.05, 0 (0.09 − 0.1), 0.001
    overhead = latency["cpu_dispatch_overhead_s"]
    assert (overhead["count"], overhead["min"], overhead["max"]) == (4, 0.0, 0.1)
    assert latency["cpu_execute_s"]["count"] == 4 and latency["cpu_execute_s"]["max"] == 0.5
    # finished jobs' round trips 0.6, 0.25, 0.09, 0.002 (a failed job's is in the phases, not here)
    roundtrip = latency["cpu_roundtrip_s"]
    assert [roundtrip[k] for k in ("count", "min", "max", "mean")] == [4, 0.002, 0.6, 0.2355]
    assert latency["turns_per_trajectory"] == {
        "count": 3,
        "mean": 2.666667,
        "min": 1.0,
        "p50": 3.0,
        "p95": 3.9,
        "max": 4.0,
    }
    assert latency["trajectory_s"]["mean"] == round(20 / 3, 6)
    assert latency["model_latency_s"]["count"] == 3  # finished requests only


def test_scheduler_diagnostics() -> None:
    scheduler = _summary()["scheduler"]
    assert (scheduler["decisions"], scheduler["eligible_decisions"], scheduler["reorders"]) == (4, 3, 2)
    assert scheduler["activation_rate"] == round(2 / 3, 6)  # reorders ÷ eligible decisions
    assert scheduler["reasons"] == {
        "hard_starvation_fifo": 1,
        "low_model_supply_predicted_unlock": 1,
        "tail_critical_path": 2,
    }
    assert scheduler["max_queue_depth"] == 5
    prediction = scheduler["prediction"]
    assert prediction["sources"] == {"model": 2, "prior": 1}
    # pairs: jobs 2 (a repair) and... job 3 raised, job 4 timed out, job 1 had no prediction: one pair
    assert (prediction["pairs"], prediction["pairs_repairs"], prediction["pairs_first"]) == (1, 1, 0)


def test_a_summary_without_a_window_keeps_its_missing_values_missing() -> None:
    summary = _summary(None)
    assert summary["makespan_s"] is None and summary["bounds"] is None
    assert summary["throughput"]["completed_per_wall_hour"] is None
    assert summary["client_cpu_blocked"]["seconds"] is None
    assert summary["client_cpu_blocked"]["fraction_of_makespan"] is None
    assert summary["model"]["circuit"]["paused_s"] is None
    assert summary["counts"]["completed"] == 1  # what was counted stays counted


def test_bounds_from_the_streams_work() -> None:
    """Work per trajectory (model latencies + execute times, a failed job's round trip): a 3.701 s,
    b 4.1 s, c 2.0 s, d 1.0 s (unfinished); model 7 s over 2 in flight, CPU 3.801 s over 2 workers."""
    bounds = _summary()["bounds"]
    assert bounds["terms"] == {
        "model_service_s": 3.5,
        "cpu_execute_s": 1.9005,
        "trajectory_work_s": 2.70025,  # 10.801 s over 4 active slots
        "longest_trajectory_s": 4.1,
        "admission_order_s": 4.1,  # a, b, c, d placed on 4 slots in order
    }
    assert (bounds["lower_bound_s"], bounds["efficiency"]) == (4.1, 0.205)


def test_phase_totals_are_rounded_to_the_microsecond() -> None:
    from asyncroll.events import ModelStarted

    builder = SummaryBuilder()
    for event in (
        TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1),
        ModelStarted(id="a", request_id=1, turn=0, inflight=1, queued_s=0.1234567),
        TrajectoryFinished(id="a", status="completed", turns=1, tool_calls=0, duration_s=1.0),
    ):
        builder(event)
    summary = builder.build(
        makespan_s=1.0, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
    )
    assert summary["phases"]["model_queue_s"] == 0.123457
    assert summary["phases"]["fractions_of_trajectory_time"]["model_queue_s"] == 0.123457
