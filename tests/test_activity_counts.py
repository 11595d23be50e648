"""What both views draw from a run's events (``collect_activity``): the counts trace.json's metadata
states (valid lines read, the time origin, damaged and unknown lines), the counters (active trajectories,
CPU queue depth with jobs cancelled in the queue, model requests and their slots), where a failed request
or job ends its span, a job's own execution inside it, and a telemetry gap still open at the end."""

from __future__ import annotations

from pathlib import Path

from asyncroll import events as ev
from asyncroll.outputs.activity import collect_activity
from tests.event_records import at, cpu_enqueued, cpu_failed, cpu_finished, cpu_selected
from tests.export_checks import load_trace
from tests.synthetic_runs import make_run, trajectory


def test_the_metadata_counts_every_event_read_from_its_origin(tmp_path: Path) -> None:
    events = trajectory("a", 0, 0.5, worker=0)
    run = make_run(tmp_path, events)
    metadata = load_trace(run)["metadata"]
    assert metadata["events"] == len(events)
    assert metadata["time_origin_s"] == 0.5  # the first event's t
    activity = collect_activity(run / "events.jsonl")
    assert (activity.t_min, activity.t_max) == (0.5, max(e.t for e in events))
    # the timeline's layout gives trajectories their own row up to a count of their spans
    assert activity.spans.trajectory_spans == sum(span.cat == "trajectory" for span in activity.spans) == 1


def test_a_missing_events_file_counts_no_event(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    metadata = load_trace(tmp_path / "run")["metadata"]
    assert (metadata["events"], metadata["time_origin_s"]) == (0, 0.0)
    activity = collect_activity(tmp_path / "run" / "events.jsonl")
    assert (activity.events, activity.t_min, activity.t_max) == (0, 0.0, 0.0)


def test_overlapping_trajectories_count_up_and_down_and_use_two_request_slots(tmp_path: Path) -> None:
    """Two trajectories at once: the active count goes 1, 2, 1, 0; both jobs wait together (depth 2) and
    leave one by one; their first model requests overlap, so two request slots, each used in turn."""
    first = trajectory("a", 0, 0.0, worker=0)
    second = [
        e.model_copy(update={"queue_depth": 2}) if isinstance(e, ev.CpuEnqueued) else e
        for e in trajectory("b", 1, 0.005, worker=1)
    ]
    activity = collect_activity(make_run(tmp_path, first + second) / "events.jsonl")
    values = {name: [v for _, v in series] for name, series in activity.counters.items()}
    assert values["active_trajectories"] == [1, 2, 1, 0]
    assert values["cpu_queue_depth"] == [1, 2, 1, 0]
    assert values["model_outstanding"] == [1, 2, 1, 0] * 2  # a start changes nothing: not drawn again
    assert activity.model_lanes == 2
    lanes = [span.track for span in activity.spans if span.cat == "model"]
    assert sorted(set(lanes)) == [("model", 0), ("model", 1), ("trajectory", "a"), ("trajectory", "b")]


def test_a_job_cancelled_in_the_queue_leaves_it_and_is_drawn_cancelled(tmp_path: Path) -> None:
    """Three jobs wait; a stop cancels the last while two wait, the first leaves as it is selected, then the
    stop cancels the second: the depth falls one at a time to 0, and a cancelled job's queue span says so."""
    events: list[ev.Event] = [ev.TrajectoryStarted(t=0.0, id="a", index=0, prompt_chars=1, active=1)]
    events += [
        at(t, cpu_enqueued(job=job, tool="add", queue_depth=job))
        for job, t in ((1, 0.1), (2, 0.2), (3, 0.21))
    ]
    events += [at(t, cpu_failed(job=job, tool="add", reason="cancelled")) for job, t in ((3, 0.22), (2, 0.3))]
    events.append(at(0.25, cpu_selected(waited_s=0.15)))
    activity = collect_activity(make_run(tmp_path, events) / "events.jsonl")
    assert list(activity.counters["cpu_queue_depth"]) == [
        (0.1, 1),
        (0.2, 2),
        (0.21, 3),
        (0.22, 2),
        (0.25, 1),
        (0.3, 0),
    ]
    queued = {span.args["job_id"]: span.state for span in activity.spans if span.cat == "cpu_queue"}
    assert queued == {1: "ok", 2: "cancelled", 3: "cancelled"}


def test_a_failed_job_that_never_began_is_an_unmatched_end_and_leaves_the_queue_depth_alone(
    tmp_path: Path,
) -> None:
    events: list[ev.Event] = [
        ev.TrajectoryStarted(t=0.0, id="a", index=0, prompt_chars=1, active=1),
        at(0.1, cpu_enqueued(tool="add")),
        at(0.2, cpu_failed(job=9, tool="add")),
    ]
    activity = collect_activity(make_run(tmp_path, events) / "events.jsonl")
    assert list(activity.counters["cpu_queue_depth"]) == [(0.1, 1)]
    unmatched = [(span.track, span.label) for span in activity.instants if span.args.get("job_id") == 9]
    assert unmatched == [(("trajectory", "a"), "add (unmatched end)"), (("worker", 0), "add (unmatched end)")]


def test_a_request_that_fails_in_the_queue_ends_its_queue_span_and_one_that_fails_running_its_request(
    tmp_path: Path,
) -> None:
    """Request 1 is cancelled while still queued, request 2 fails after it started: each failure closes
    the span it happened in (the queue's, or the request's on the trajectory and its request slot)."""
    events: list[ev.Event] = [ev.TrajectoryStarted(t=0.0, id="a", index=0, prompt_chars=1, active=1)]
    events += [ev.ModelEnqueued(t=0.1, id="a", request_id=n, turn=0, outstanding=n) for n in (1, 2)]
    events.append(ev.ModelStarted(t=0.2, id="a", request_id=2, turn=0, inflight=1, queued_s=0.1))
    for n, kind, t in ((1, "cancelled", 0.3), (2, "http_status", 0.4)):
        events.append(ev.ModelFailed(t=t, id="a", request_id=n, turn=0, latency_s=0.1, kind=kind, error="x"))
    activity = collect_activity(make_run(tmp_path, events) / "events.jsonl")
    spans = sorted(
        (s.cat, s.args["request_id"], s.track, s.state, s.end)
        for s in activity.spans
        if s.cat != "trajectory"
    )
    assert spans == [
        ("model", 2, ("model", 0), "failed", 0.4),
        ("model", 2, ("trajectory", "a"), "failed", 0.4),
        ("model_queue", 1, ("trajectory", "a"), "cancelled", 0.3),
        ("model_queue", 2, ("trajectory", "a"), "ok", 0.2),
    ]
    assert not activity.instants  # nothing unmatched
    assert [v for _, v in activity.counters["model_outstanding"]] == [1, 2, 1, 0]


def finished_job(t: float, started: float, finished: float) -> ev.CpuFinished:
    return at(t, cpu_finished(tool="add", execute_s=finished - started, started=started, finished=finished))


def test_the_childs_execution_is_drawn_inside_its_job_or_where_it_says_without_one(tmp_path: Path) -> None:
    """The child's own execution times come from another clock's rounding: inside a job that began they are
    clamped to the job's span; for a job whose start was never seen they are drawn as they are."""
    started = ev.CpuStarted(t=1.0, id="a", job_id=1, worker=0, pid=7, generation=0)
    for name in ("in", "alone"):
        (tmp_path / name).mkdir()
    inside = collect_activity(
        make_run(tmp_path / "in", [started, finished_job(2.0, 0.9, 2.5)]) / "events.jsonl"
    )
    alone = collect_activity(make_run(tmp_path / "alone", [finished_job(2.0, 0.9, 2.5)]) / "events.jsonl")
    execute = [(s.track, s.start, s.end, s.state) for s in inside.spans if s.cat == "execute"]
    assert execute == [(("worker", 0), 1.0, 2.0, "ok")]  # on the worker's track, under its job
    assert [(s.start, s.end) for s in alone.spans if s.cat == "execute"] == [(0.9, 2.5)]


def test_a_gap_still_open_at_the_last_sample_ends_there(tmp_path: Path) -> None:
    samples: list[ev.Event] = [ev.ResourceSample(t=0.0, seq=0, server_running=2.0)]
    samples += [
        ev.ResourceSample(t=t, seq=n, nulls={"server_running": "error"}) for n, t in ((1, 0.1), (2, 0.2))
    ]
    activity = collect_activity(make_run(tmp_path, samples) / "events.jsonl")
    gaps = [(g.name, g.start, g.end, g.samples, g.reasons) for g in activity.counter_gaps]
    assert gaps == [("server_running", 0.1, 0.2, 2, ["error"])]


def test_a_damaged_line_of_a_known_event_is_invalid_and_one_of_an_unknown_event_is_counted_by_name(
    tmp_path: Path,
) -> None:
    """A line that names an event this version knows but fails its schema is damaged (invalid); a line
    that names an event this version does not know is from a newer schema (unknown, by name)."""
    damaged = ('{"v":1,"t":0.1,"event":"cpu_finished","id":"a"}', '{"v":1,"t":0.2,"event":"from_later"}')
    activity = collect_activity(make_run(tmp_path, [], extra_lines=damaged) / "events.jsonl")
    assert (activity.invalid_lines, dict(activity.unknown)) == (1, {"from_later": 1})
