"""summary.json's own arithmetic on hand-made event streams: the phase breakdown, correlations, rates."""

from __future__ import annotations

import json
from typing import Any

from asyncroll.events import (
    CpuFailed,
    Event,
    JobKind,
    ModelFailed,
    ModelFinished,
    ModelStarted,
    TrajectoryFinished,
    TrajectoryStarted,
)
from asyncroll.floats import left_to_right_sum
from asyncroll.outputs.statistics import distribution, pearson, pearson_missing
from asyncroll.outputs.summary import SummaryBuilder
from tests.event_records import at, cpu_finished, cpu_selected

LIMITS = {"max_active_trajectories": 2, "max_inflight_model_requests": 2, "cpu_workers": 1}


def summarise(events: list[Event]) -> dict[str, Any]:
    builder = SummaryBuilder()
    for event in events:
        builder(event)
    return builder.build(
        makespan_s=20.0, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
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
        cpu_selected("a", 1, waited_s=0.25),
        CpuFailed(
            id="a", job_id=1, worker=0, kind="tool", tool="t", reason="timeout", roundtrip_s=3.0, error="x"
        ),
        ModelStarted(id="a", request_id=3, turn=1, inflight=1, queued_s=0.0),
        ModelFailed(id="a", request_id=3, turn=1, latency_s=1.0, kind="invalid_action", error="x"),
        cpu_selected("a", 2),
        cpu_finished("a", 2, kind="grade", tool="__grade__", execute_s=0.5, roundtrip_s=0.6),
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


def test_means_add_left_to_right_on_every_python() -> None:
    """The bits Python 3.11's ``sum`` gave: from 3.12 on ``sum`` of floats compensates rounding, so the same
    samples wrote another mean (here 0.333333 instead of 0.0) on another Python."""
    assert distribution([1e16, 1.0, -1e16])["mean"] == 0.0
    assert distribution([0.1, 0.2, 0.3])["mean"] == round(0.6000000000000001 / 3, 6)
    assert left_to_right_sum([0.1, 0.2, 0.3]) == 0.6000000000000001  # 0.6 by 3.12's sum


def test_cancelled_tool_calls_are_not_in_the_error_rate() -> None:
    """Two calls ended in errors and two were cancelled when the run stopped: the rate over calls with
    an outcome is 1.0 (it read 0.5, the cancelled calls counting as successes)."""
    events: list[Event] = [
        TrajectoryStarted(id=t, index=i, prompt_chars=1, active=1) for i, t in enumerate("ab")
    ]
    for job, tid in enumerate("ab"):
        events.append(cpu_finished(tid, job, ok=False, execute_s=0.1, roundtrip_s=0.1, error="boom"))
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


def _build(events: list[Event], makespan_s: float | None) -> dict[str, Any]:
    builder = SummaryBuilder()
    for event in events:
        builder(event)
    return builder.build(
        makespan_s=makespan_s, policy="fifo", limits=LIMITS, cpu_cost={}, peaks={}, status="complete"
    )


def test_blocked_intervals_count_only_spans_of_positive_length() -> None:
    """A 0 s grade job at the instant the last model response arrives (a simulation's grade jobs take no
    time) made a 0 s "interval": the sync synthetic run reported 180 intervals, 60 of them instants, and
    a run of zero durations reported 3 intervals totalling 0 s. Only the real span is one."""
    from asyncroll.events import CpuEnqueued, ModelEnqueued

    def job(t0: float, t1: float, tid: str, jid: int) -> list[Event]:
        return [
            at(
                t0,
                CpuEnqueued(id=tid, job_id=jid, kind="grade", tool="g", turn=0, arg_bytes=1, queue_depth=1),
            ),
            at(
                t1,
                cpu_finished(tid, jid, kind="grade", tool="g", execute_s=t1 - t0, roundtrip_s=t1 - t0),
            ),
        ]

    events: list[Event] = [
        at(0.0, TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1)),
        at(0.0, ModelEnqueued(id="a", request_id=1, turn=0, outstanding=1)),
        at(1.0, ModelFinished(id="a", request_id=1, turn=0, latency_s=1.0, action="tool")),
        *job(1.0, 1.5, "a", 1),  # blocked 1.0-1.5: one interval
        at(1.5, ModelEnqueued(id="a", request_id=2, turn=1, outstanding=1)),
        at(2.0, ModelFinished(id="a", request_id=2, turn=1, latency_s=0.5, action="final")),
        *job(2.0, 2.0, "a", 2),  # an instant: no interval
        at(2.0, TrajectoryFinished(id="a", status="completed", turns=2, tool_calls=0, duration_s=2.0)),
    ]
    blocked = _build(events, 2.0)["client_cpu_blocked"]
    assert blocked["seconds"] == 0.5 and blocked["intervals"] == 1
    # an interval still open at the window's end counts (an interrupted run), an instant at it does not
    open_at_end = events[:4]  # the first job still running
    later, at_once = (_build(open_at_end, end)["client_cpu_blocked"] for end in (1.25, 1.0))
    assert (later["seconds"], later["intervals"]) == (0.25, 1)
    assert (at_once["seconds"], at_once["intervals"]) == (0.0, 0)


def test_a_blocked_stretch_left_and_rejoined_at_one_instant_is_one_interval() -> None:
    """a's job runs 0-0.5 s while b's jobs follow one another through model turns of 0 s (a simulated
    action without ``latency_ms``): the client is blocked throughout, yet the summary said 4 intervals,
    as if each instant b spent on a model turn split the stretch. A state that holds for an instant adds
    no time and is no interval; neither does the instant the state is left and entered again (nor a
    0 s job after the end, entered and left at one instant)."""
    from asyncroll.events import CpuEnqueued, ModelEnqueued

    request = iter(range(1, 100))

    def turn(t: float, tid: str, job: int | None) -> list[Event]:
        rid = next(request)
        events: list[Event] = [
            at(t, ModelEnqueued(id=tid, request_id=rid, turn=0, outstanding=1)),
            at(t, ModelFinished(id=tid, request_id=rid, turn=0, latency_s=0.0, action="tool")),
        ]
        if job is not None:
            enqueued = CpuEnqueued(
                id=tid, job_id=job, kind="tool", tool="t", turn=0, arg_bytes=1, queue_depth=1
            )
            events.append(at(t, enqueued))
        return events

    def done(t: float, tid: str, job: int) -> Event:
        return at(t, cpu_finished(tid, job, execute_s=0.1, roundtrip_s=0.1))

    events: list[Event] = [
        at(0.0, TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1)),
        at(0.0, TrajectoryStarted(id="b", index=1, prompt_chars=1, active=2)),
        *turn(0.0, "a", 1),
        *turn(0.0, "b", 2),
    ]
    for k, t in enumerate((0.1, 0.2, 0.3)):
        events += [done(t, "b", 2 + k), *turn(t, "b", 3 + k)]
    events += [done(0.4, "b", 5), *turn(0.4, "b", None), done(0.5, "a", 1)]
    events += [*turn(0.5, "a", 6), done(0.5, "a", 6)]  # a 0 s job at the end: entered and left at once
    blocked = _build(events, 0.5)["client_cpu_blocked"]
    assert (blocked["seconds"], blocked["intervals"]) == (0.5, 1)


def test_no_window_or_an_empty_one_is_null_with_why_never_zero() -> None:
    never = _build([], None)
    assert never["client_cpu_blocked"]["intervals"] is None  # was 0 beside seconds: null
    assert never["throughput"]["completed_per_wall_hour"] is None
    assert never["throughput"]["per_wall_hour_reason"] == "the measured window never opened"
    events: list[Event] = [
        at(0.0, TrajectoryStarted(id="a", index=0, prompt_chars=1, active=1)),
        at(0.0, TrajectoryFinished(id="a", status="completed", turns=1, tool_calls=0, duration_s=0.0)),
    ]
    empty = _build(events, 0.0)["throughput"]
    assert empty["completed_per_wall_hour"] is None and empty["trajectories_per_wall_hour"] is None
    assert empty["per_wall_hour_reason"] == "the measured window is empty (makespan 0)"
    measured = _build(events, 2.0)["throughput"]
    assert (measured["completed_per_wall_hour"], measured["per_wall_hour_reason"]) == (1800.0, None)


def predicted_job(
    job: int, predicted: float, actual: float, source: str, repair: bool = False, kind: JobKind = "tool"
) -> list[Event]:
    """One job (a tool call unless ``kind`` says otherwise) of trajectory ``a``: enqueued, selected with
    ``predicted`` seconds, run in ``actual``."""
    from asyncroll.events import CpuEnqueued

    return [
        CpuEnqueued(
            id="a", job_id=job, kind=kind, tool="x", turn=0, arg_bytes=1, queue_depth=1, resubmission=repair
        ),
        cpu_selected("a", job, predicted_s=predicted, prediction_source=source),
        cpu_finished("a", job, kind=kind, tool="x", execute_s=actual, roundtrip_s=actual),
    ]


def test_each_correlation_states_its_own_pairs() -> None:
    """pearson_log_repairs is null below 3 pairs, but only the overall count was given: a null could not
    be told from no variance. 3 first evaluations and 2 repairs: first has 3 pairs, repairs 2 (null)."""
    events: list[Event] = []
    for job, (repair, predicted, actual) in enumerate(
        [(False, 0.1, 0.12), (False, 0.2, 0.25), (False, 0.4, 0.3), (True, 0.1, 0.1), (True, 0.3, 0.2)], 1
    ):
        events += predicted_job(job, predicted, actual, "model", repair)
    prediction = summarise(events)["scheduler"]["prediction"]
    assert (prediction["pairs"], prediction["pairs_first"], prediction["pairs_repairs"]) == (5, 3, 2)
    assert prediction["pearson_log_first"] is not None and prediction["pearson_log_repairs"] is None


def test_grade_jobs_are_in_no_correlation() -> None:
    """A real run's grade jobs (one per trajectory: predicted at the 1 ms floor, run in tens of µs) made a
    cluster far below every tool call that raised the correlations (0.88 against 0.85 without them on a
    60-trajectory synthetic run), and only in real runs: a simulated grade of 0 s has no logarithm. The
    correlations measure how well the predictor ranks tool calls and evaluations."""
    events: list[Event] = []
    for job, (predicted, actual) in enumerate([(0.1, 0.3), (0.2, 0.1), (0.3, 0.2)], 1):
        events += predicted_job(job, predicted, actual, "model")
    for job in range(4, 10):
        events += predicted_job(job, 0.001, 0.00003, "model", kind="grade")
    prediction = summarise(events)["scheduler"]["prediction"]
    assert (prediction["pairs"], prediction["pairs_first"]) == (3, 3)
    assert prediction["pearson_log"] == prediction["pearson_log_first"] == -0.5


def test_a_null_correlation_states_why() -> None:
    """Equal predictions over 4 pairs (every job at the prior, say) leave the correlation undefined: it is
    null, and summary.json says why, where it said nothing a reader could tell from another null."""
    events: list[Event] = []
    for job, actual in enumerate([0.1, 0.2, 0.3, 0.4], 1):
        events += predicted_job(job, 0.1, actual, "prior")
    prediction = summarise(events)["scheduler"]["prediction"]
    assert prediction["pairs"] == 4 and prediction["pearson_log"] is None
    assert prediction["pearson_null_reasons"] == {
        "pearson_log": "no variance: every predicted time is the same",
        "pearson_log_first": "no variance: every predicted time is the same",
        "pearson_log_repairs": "fewer than 3 pairs (0)",
    }
    json.dumps(prediction, allow_nan=False)  # valid JSON: no NaN anywhere
    assert summarise([])["scheduler"]["prediction"]["pearson_null_reasons"] == {
        "pearson_log": "fewer than 3 pairs (0)",
        "pearson_log_repairs": "fewer than 3 pairs (0)",
        "pearson_log_first": "fewer than 3 pairs (0)",
    }
    assert pearson_missing([1.0, 2.0, 3.0], [2.0, 4.0, 6.5]) is None
    assert pearson_missing([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == "no variance: every actual time is the same"
