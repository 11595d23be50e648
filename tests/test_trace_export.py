"""trace.json from synthetic run directories: a normal run, a tool timeout, incomplete, unmatched, unknown
and damaged lines, what a stop cancelled, a failed export, bounded memory, and the spool under it."""

from __future__ import annotations

import json
import math
import shutil
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from asyncroll import events as ev
from asyncroll.outputs import rundir, timeline
from asyncroll.outputs import trace as trace_export
from asyncroll.outputs.spool import Spool
from asyncroll.outputs.timeline import timeline_data, write_timeline
from tests.conftest import invoke
from tests.event_records import cpu_selected
from tests.export_checks import check_trace_format, chromium_page, load_trace, page_data, thread_names
from tests.synthetic_runs import (
    RUN,
    SMOKE,
    SUMMARY,
    broken_events,
    make_run,
    normal_events,
    timeout_events,
    trajectory,
)


def test_normal_run_trace(tmp_path: Path) -> None:
    trace = load_trace(make_run(tmp_path, normal_events()))
    body = check_trace_format(trace)
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert procs == {"trajectories", "workers", "model requests", "scheduler"}
    assert thread_names(trace, 1) == ["trajectory a", "trajectory b", "trajectory c"]
    assert thread_names(trace, 2) == ["worker 0", "worker 1"]
    spans = [e for e in body if e["ph"] == "X"]
    assert [e["name"] for e in spans if e["cat"] == "trajectory"] == ["completed"] * 3
    jobs = [e for e in spans if e["cat"] == "cpu" and e["pid"] == 2]
    assert len(jobs) == 3 and all(e["args"]["ok"] is True and e["args"]["tool"] == "add" for e in jobs)
    assert {"job_id", "kind"} <= set(jobs[0]["args"])
    execute = [e for e in spans if e["cat"] == "execute"]
    assert len(execute) == 3 and execute[0]["dur"] == 20_000
    assert sum(e["cat"] == "model" for e in spans) == 12  # 6 requests, on the trajectory and a request slot
    assert not any(e["name"].endswith(")") for e in spans)  # nothing failed, incomplete or unmatched
    first_traj = next(e for e in spans if e["cat"] == "trajectory")
    assert first_traj["ts"] == 500_000  # shifted: the earliest event (worker_ready at -0.5 s) is ts 0
    counters = defaultdict(list)
    for e in body:
        if e["ph"] == "C":
            counters[e["name"]].append(e["args"]["value"])
    assert counters["CPU queue depth"] == [1, 0] * 3
    assert (
        max(counters["model requests outstanding"]) == 1 and counters["model requests outstanding"][-1] == 0
    )
    assert counters["active trajectories"][-1] == 0
    reorders = [e for e in body if e["ph"] == "i" and e["cat"] == "reorder"]
    assert len(reorders) == 1 and reorders[0]["args"]["reason"] == "fifo" and reorders[0]["pid"] == 4
    assert trace["metadata"]["policy"] == "asyncroll" and trace["metadata"]["unknown_events"] == {}


def test_worker_timeout_trace(tmp_path: Path) -> None:
    body = check_trace_format(load_trace(make_run(tmp_path, timeout_events())))
    failed = [e for e in body if e["ph"] == "X" and e["cat"] == "cpu"]
    assert {e["name"] for e in failed} == {"spin_ms (failed)"}
    assert all(e["args"]["error"].startswith("timeout:") and e["args"]["ok"] is False for e in failed)
    restart = next(e for e in body if e["ph"] == "i" and e["name"].startswith("worker restart"))
    assert restart["args"]["reason"] == "timeout" and restart["args"]["generation"] == 1
    assert restart["pid"] == 2 and restart["s"] == "t"
    traj = next(e for e in body if e["cat"] == "trajectory")
    assert traj["name"] == "failed" and traj["args"]["error"] == "tool timeout"


UNKNOWN_LINE = '{"v":1,"t":0.3,"event":"from_the_future","id":null,"gpu_util":50}'

TRUNCATED_LINE = '{"v":1,"t":0.4,"event":"model_sta'


def test_incomplete_unmatched_and_unknown_lines(tmp_path: Path) -> None:
    run = make_run(tmp_path, broken_events(), (UNKNOWN_LINE, TRUNCATED_LINE, ""))
    trace = load_trace(run)
    body = check_trace_format(trace)
    last = max(e["ts"] for e in body)
    incomplete = [e for e in body if e["ph"] == "X" and e["name"].endswith("(incomplete)")]
    assert {e["name"] for e in incomplete} == {"model turn 0 (incomplete)", "running (incomplete)"}
    assert all(e["ts"] + e["dur"] == last and e["args"]["state"] == "incomplete" for e in incomplete)
    unmatched = [e for e in body if e["name"] == "add (unmatched end)"]
    assert len(unmatched) == 2 and all(e["ph"] == "i" for e in unmatched)  # trajectory y and worker 1
    assert all(e["args"]["state"] == "unmatched" for e in unmatched)
    assert trace["metadata"]["unknown_events"] == {"from_the_future": 1}
    assert trace["metadata"]["invalid_lines"] == 1


def test_missing_events_file_gives_an_empty_valid_trace(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    trace = load_trace(tmp_path / "run")
    assert check_trace_format(trace) == [] and trace["metadata"]["events_file"] == "missing"


def export_peak_bytes(tmp_path: Path, n: int) -> int:
    """tracemalloc's peak while exporting a run of ``n`` trajectories (as a run does: one pass, two files)."""
    events = [
        e for i in range(n) for e in trajectory(f"t{i}", i, 0.01 * i, worker=i % 4, reordered=i % 3 == 0)
    ]
    run = make_run(tmp_path / str(n), events)
    tracemalloc.start()
    try:
        exports = rundir.export(run)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exports["trace.json"]["ok"] and exports["timeline.html"]["ok"], exports
    return peak


@pytest.mark.timeout(120)
def test_export_memory_does_not_grow_with_the_spans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC §3: spans wait on disk, trace.json is sorted in bounded chunks and the page holds at most
    MAX_SPANS spans, so what an export holds per trajectory is a few small numbers (its id, its spans'
    starts and ends for the bars, counter steps): ~1.6 KB here, where holding every span and building the
    whole trace took ~24 KB. Limits scaled down so that these small runs cross them all."""
    monkeypatch.setattr(trace_export, "SORT_CHUNK", 2_000)
    monkeypatch.setattr(timeline, "MAX_SPANS", 1_000)
    monkeypatch.setattr(timeline, "MAX_INSTANTS", 200)
    monkeypatch.setattr(timeline, "MAX_TRAJECTORY_ROWS", 100)
    (tmp_path / "400").mkdir()
    (tmp_path / "1600").mkdir()
    small, large = export_peak_bytes(tmp_path, 400), export_peak_bytes(tmp_path, 1_600)
    per_trajectory = (large - small) / 1_200
    assert per_trajectory < 3_000, f"{per_trajectory:.0f} bytes per trajectory ({small:,} → {large:,})"


def test_a_failed_trace_export_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path, normal_events())

    def half_then_fail(path: Path, *_: Any) -> None:
        path.write_bytes(b'{"traceEvents":[')
        raise RuntimeError("disk full")

    monkeypatch.setattr(trace_export, "_write", half_then_fail)
    exports = rundir.export(run)
    assert exports["trace.json"] == {"ok": False, "error": "RuntimeError: disk full"}
    assert exports["timeline.html"]["ok"]
    assert sorted(p.name for p in run.iterdir()) == ["events.jsonl", "timeline.html"]


def test_a_spool_reads_back_in_order_any_number_of_times(tmp_path: Path) -> None:
    spool = Spool(tmp_path, batch=3)
    spool.extend((i, str(i)) for i in range(7))
    assert list(spool) == list(spool) == [(i, str(i)) for i in range(7)]
    spool.append((7, "7"))  # after a read: a new batch, seen by the next read
    assert len(spool) == 8 and list(spool)[-1] == (7, "7")
    assert list(tmp_path.iterdir()) == []  # the file was unlinked at once
    spool.close()
    assert len(spool) == 0 and list(spool) == []


def stopped_events() -> list[ev.Event]:
    """A run stopped under a request and a job (both end ``cancelled``), beside a real model error and a
    tool timeout: only the last two failed."""
    return [
        *timeout_events(),
        ev.TrajectoryStarted(t=0.0, id="cut", index=1, prompt_chars=5, active=2),
        ev.ModelEnqueued(t=0.0, id="cut", request_id=1, turn=0, outstanding=1),
        ev.ModelStarted(t=0.0, id="cut", request_id=1, turn=0, inflight=1, queued_s=0.0),
        ev.ModelFailed(
            t=0.2, id="cut", request_id=1, turn=0, latency_s=0.2, kind="http", error="500", status=500
        ),
        ev.ModelEnqueued(t=0.3, id="cut", request_id=2, turn=1, outstanding=1),
        ev.ModelStarted(t=0.3, id="cut", request_id=2, turn=1, inflight=1, queued_s=0.0),
        ev.ModelFailed(
            t=1.5,
            id="cut",
            request_id=2,
            turn=1,
            latency_s=1.2,
            kind="cancelled",
            error="the run was stopped",
        ),
        ev.TrajectoryStarted(t=1.1, id="job", index=2, prompt_chars=5, active=3),
        ev.CpuEnqueued(
            t=1.1, id="job", job_id=8, kind="tool", tool="spin_ms", turn=0, arg_bytes=4, queue_depth=1
        ),
        cpu_selected("job", 8, t=1.1, worker=1),
        ev.CpuStarted(t=1.1, id="job", job_id=8, worker=1, pid=101, generation=0),
        ev.CpuFailed(
            t=1.5,
            id="job",
            job_id=8,
            worker=1,
            kind="tool",
            tool="spin_ms",
            reason="cancelled",
            roundtrip_s=0.4,
            error="the run was stopped while this job held a worker",
        ),
        ev.MeasurementFinished(t=1.5, status="interrupted", makespan_s=1.5),
    ]


def test_what_a_stop_cancelled_is_drawn_cancelled_not_failed(tmp_path: Path) -> None:
    """A request or job the stop cancelled did not fail (MEASUREMENT.md: neither a model error nor a
    response; the summary counts it apart): both views named every one of them "(failed)" in red."""
    run = make_run(tmp_path, stopped_events())
    body = check_trace_format(load_trace(run))
    states = {(e["name"], e["pid"]): e["args"].get("state", "ok") for e in body if e["ph"] == "X"}
    assert states[("model turn 1 (cancelled)", 1)] == states[("model turn 1 (cancelled)", 3)] == "cancelled"
    assert states[("spin_ms (cancelled)", 1)] == states[("spin_ms (cancelled)", 2)] == "cancelled"
    assert states[("model turn 0 (failed)", 1)] == "failed"  # a real error still fails
    assert states[("spin_ms (failed)", 2)] == "failed"  # and so does a timeout
    data = timeline_data(run)
    drawn = {(data["strings"][s[5]], data["states"][s[4]]) for s in data["spans"]}
    assert {("model turn 1 (cancelled)", "cancelled"), ("spin_ms (cancelled)", "cancelled")} <= drawn
    assert ("model turn 0 (failed)", "failed") in drawn and ("spin_ms (failed)", "failed") in drawn


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (.ci/run installs it)"
)
def test_a_page_with_cancelled_spans_draws_in_headless_chromium(tmp_path: Path) -> None:
    page = write_timeline(make_run(tmp_path, stopped_events(), summary=SUMMARY, run=RUN))
    attrs, console = chromium_page(page, tmp_path)
    assert console == [] and "error" not in attrs, attrs
    assert "cancelled by the stop" in page.read_text()  # its own colour, named in the legend


def test_a_time_no_run_can_reach_is_a_damaged_line_not_a_failed_export(tmp_path: Path) -> None:
    """events.jsonl parses NaN and 1e308 as numbers: a job's ``started`` of NaN, one event 1e308 s away
    from the others, or a wait for the server of 1e308 s (with no request of its own to be clamped to)
    made both exports fail (ValueError / OverflowError converting to µs), so ``asyncroll timeline`` could
    draw nothing of the run."""
    events = normal_events()
    job = next(i for i, e in enumerate(events) if isinstance(e, ev.CpuFinished))
    events[job] = events[job].model_copy(update={"started": math.nan})
    events.append(ev.ModelPaused(t=0.3, id="z", turn=0, attempt=2, waited_s=1e308))
    lines = [json.dumps(e.model_dump()) for e in sorted(events, key=lambda e: e.t)]
    far = ev.ModelRetrying(t=1e308, id="a", turn=0, attempt=1, kind="transport", delay_s=0.1, error="x")
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text("\n".join([*lines, json.dumps(far.model_dump())]) + "\n")
    exports = rundir.export(run)
    assert exports["trace.json"]["ok"] and exports["timeline.html"]["ok"], exports
    assert exports["events_skipped"]["invalid_lines"] == 1  # the far event; the job is drawn
    body = check_trace_format(json.loads((run / "trace.json").read_text()))
    assert sum(e["cat"] == "execute" for e in body if e["ph"] == "X") == 2  # not the one without a start
    assert sum(e["cat"] == "cpu" and e["pid"] == 2 for e in body if e["ph"] == "X") == 3
    [wait] = [e for e in body if e["name"] == "waiting for the server"]
    assert wait["ts"] == 0 and wait["ts"] + wait["dur"] == 800_000  # from the run's first event to its end
    data = page_data((run / "timeline.html").read_text())
    assert data["t1"] < 1  # the page's time axis is the run's, not 1e308 s long


def test_a_parent_span_comes_before_a_child_of_the_same_extent(tmp_path: Path) -> None:
    """On a virtual clock a trajectory and its only model turn start and end at the same µs; trace.json
    put the turn first (the trajectory span is written when it ends, after its children), so Perfetto
    drew the trajectory ("completed") as a slice inside its own model turn."""
    out = tmp_path / "sim"
    done = invoke("simulate", "--workload", SMOKE, "--output", out)
    assert done.exit_code == 0, done.output
    body = check_trace_format(json.loads((out / "trace.json").read_text()))
    depth = {"trajectory": 0, "execute": 2, "circuit": 2}
    first: dict[tuple[int, int, int, int], dict[str, Any]] = {}
    ties = 0
    for e in (e for e in body if e["ph"] == "X"):
        key = (e["pid"], e["tid"], e["ts"], e["dur"])
        if key in first:
            ties += 1
            assert depth.get(first[key]["cat"], 1) <= depth.get(e["cat"], 1), (first[key], e)
        else:
            first[key] = e
    assert ties  # the smoke workload's answer-only trajectory is one such tie


def test_the_trace_layout_names_each_process_and_thread_in_order(tmp_path: Path) -> None:
    """Perfetto draws what the metadata says: one process per kind (trajectories, workers, model request
    slots, scheduler), sorted in that order, each thread named and sorted from 1 (tid 0 carries the process's
    own metadata); each counter is drawn under the process it belongs to."""
    trace = load_trace(make_run(tmp_path, normal_events()))
    meta = [(e["name"], e["pid"], e["tid"], e["args"]) for e in trace["traceEvents"] if e["ph"] == "M"]
    processes = [("trajectories", 1), ("workers", 2), ("model requests", 3), ("scheduler", 4)]
    threads = [(1, "trajectory a"), (1, "trajectory b"), (1, "trajectory c"), (2, "worker 0")]
    threads += [(2, "worker 1"), (3, "request slot 0"), (4, "scheduler")]
    expected = []
    for name, pid in processes:
        expected += [
            ("process_name", pid, 0, {"name": name}),
            ("process_sort_index", pid, 0, {"sort_index": pid}),
        ]
    tid = {1: 0, 2: 0, 3: 0, 4: 0}
    for pid, name in threads:
        tid[pid] += 1
        expected += [("thread_name", pid, tid[pid], {"name": name})]
        expected += [("thread_sort_index", pid, tid[pid], {"sort_index": tid[pid]})]
    assert meta == expected
    counters = {(e["name"], e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "C"}
    assert counters == {
        ("active trajectories", 1, 0),
        ("CPU queue depth", 2, 0),
        ("model requests outstanding", 3, 0),
    }
    slices = {(e["cat"], e["pid"]) for e in trace["traceEvents"] if e["ph"] in "Xi"}
    assert {pid for cat, pid in slices if cat in ("trajectory", "model_queue", "cpu_queue")} == {1}
    assert {pid for cat, pid in slices if cat in ("execute", "worker")} == {2}
    assert {pid for cat, pid in slices if cat in ("measurement", "reorder")} == {4}


def test_a_trace_sorted_in_chunks_on_disk_is_the_one_sorted_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``SORT_CHUNK`` events the body is sorted in runs that wait on disk and are merged: every event
    comes back, in the same order as one sort in memory (the memory test above only weighs the export)."""
    events = [e for i in range(12) for e in trajectory(f"t{i}", i, 0.01 * i, worker=i % 3)]
    for name in ("memory", "disk"):
        (tmp_path / name).mkdir()
    in_memory = load_trace(make_run(tmp_path / "memory", events))
    monkeypatch.setattr(trace_export, "SORT_CHUNK", 7)
    on_disk = load_trace(make_run(tmp_path / "disk", events))
    assert len(in_memory["traceEvents"]) > 10 * 7
    assert on_disk["traceEvents"] == in_memory["traceEvents"]
