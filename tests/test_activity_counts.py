"""The numbers trace.json's metadata states about the events it drew: how many valid lines it read and
the time origin, for a run with events and for one whose events file is missing."""

from __future__ import annotations

from pathlib import Path

from asyncroll.outputs.activity import collect_activity
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
