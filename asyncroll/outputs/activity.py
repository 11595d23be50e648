"""A run's activity: its events paired into spans, instants and counters, which every view draws.

:func:`collect_activity` is the one place where begin/end events are paired into spans (trajectories, model
queue and request, CPU queue and job, child execution), instants (worker restarts, reorders, unmatched ends)
and counters (CPU queue depth, model requests outstanding, active trajectories, and the telemetry samples
of ``resource_sample`` events when a source was available). ``trace.json`` (:mod:`asyncroll.outputs.trace`)
and ``timeline.html`` (:mod:`asyncroll.outputs.timeline`) both draw from it, so the two views can never
disagree. It streams ``events.jsonl`` line by line and keeps in memory only the open begins, the trajectory
ids and compact counter series: finished spans and instants go to a :class:`SpanLog`, an anonymous temporary
file beside the events that each view reads back in order, so that the export's memory does not grow with
the run's spans (SPEC §3). It never crashes on a line it cannot read: lines of unknown event types (a newer
schema) and invalid lines are skipped and counted. Pairing is robust by design: a failed end labels its span
(a request or job the stopping run cancelled is labelled cancelled, not failed: it has no outcome),
a begin without an end is drawn to the last timestamp of the run as "(incomplete)", and an end without a
begin becomes an "(unmatched end)" instant; nothing is dropped.

A telemetry value that a sample did not give (``null``) is never drawn as the last good value: its
counter series gets a ``None`` point where the value stops being known (``timeline.html`` breaks its line
there) and the run of null samples becomes a :class:`CounterGap`. The HTTP backend's server circuit
(``server_unavailable`` → ``server_available``) is a "server unavailable" span on the scheduler track, and
a request's wait for it (``model_paused``) a span inside that request on its trajectory; a stall of the
event loop (``loop_stalled``) is an "event loop stalled" span on the scheduler track, and a stop of the whole
process (``process_stopped``: job control) a "process stopped (job control)" one. The types drawn
(:class:`Activity`, :class:`Span`, :class:`SpanLog`, ...) are in :mod:`asyncroll.outputs.activity_model`.
"""

from __future__ import annotations

import heapq
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asyncroll import events as ev
from asyncroll.json_depth import json_loads
from asyncroll.outputs.activity_model import (
    RESOURCE_LABELS,
    Activity,
    CounterGap,
    Series,
    Span,
    SpanLog,
    Track,
)


def _time_ok(t: float) -> bool:
    return math.isfinite(t) and abs(t) <= ev.MAX_EVENT_TIME_S


KNOWN_EVENTS: frozenset[str] = frozenset(
    cls.model_fields["event"].default for cls in typing.get_args(typing.get_args(ev.AnyEvent)[0])
)


@dataclass(slots=True)
class _Open:
    tracks: tuple[Track, ...]
    cat: str
    name: str
    start: float
    args: dict[str, Any]


def _pick(e: ev.Event, *names: str) -> dict[str, Any]:
    """The named fields of an event that are not None, as span args (NaN/inf as text: JSON has neither)."""
    out = {n: v for n in names if (v := getattr(e, n)) is not None}
    return {n: str(v) if isinstance(v, float) and not math.isfinite(v) else v for n, v in out.items()}


class _Pairer:
    """Turns the event stream into an :class:`Activity`, one event at a time."""

    def __init__(self, spool: Path | None = None) -> None:
        self.a = Activity(spans=SpanLog(spool), instants=SpanLog(spool))
        self.open: dict[tuple[str, Any], _Open] = {}
        self.seen_traj: set[Any] = set()
        # job_id -> (trajectory id, tool, kind), from enqueue until the job ends
        self.jobs: dict[int, tuple[Any, str, str]] = {}
        self.outstanding: set[int] = set()
        self.depth = 0
        self.active = 0
        self.free_lanes: list[int] = []
        self.lane_of: dict[int, int] = {}
        self.gaps: dict[str, CounterGap] = {}  # telemetry counters without a value now
        self.model_began: dict[Any, float] = {}  # trajectory → start of its latest model request

    def traj(self, tid: Any) -> Track:
        if tid not in self.seen_traj:
            self.seen_traj.add(tid)
            self.a.trajectories.append(tid)
        return ("trajectory", tid)

    def worker(self, n: int) -> Track:
        self.a.workers.add(n)
        return ("worker", n)

    def count(self, name: str, t: float, value: float | None) -> None:
        series = self.a.counters.setdefault(name, Series())
        if not series or series.values[-1] != value:
            series.append(t, value)

    def instant(
        self, track: Track, cat: str, name: str, t: float, args: dict[str, Any], state: str = "ok"
    ) -> None:
        self.a.instants.append(Span(track, cat, name, t, t, state, args))

    def begin(
        self, kind: str, key: Any, tracks: tuple[Track, ...], name: str, t: float, args: dict[str, Any]
    ) -> None:
        previous = self.open.pop((kind, key), None)
        if previous is not None:  # a duplicate begin: keep the first one visible rather than lose it
            self.close(previous, self.a.t_max, "incomplete", {})
        self.open[(kind, key)] = _Open(tracks, kind, name, t, args)

    def end(
        self,
        kind: str,
        key: Any,
        t: float,
        state: str,
        fallback: tuple[Track, ...],
        name: str | None,
        args: dict[str, Any],
    ) -> _Open | None:
        """Close the span opened under ``(kind, key)``; an end without a begin becomes an instant."""
        entry = self.open.pop((kind, key), None)
        if entry is None:
            for track in fallback:
                self.instant(track, kind, name or kind.replace("_", " "), t, args, "unmatched")
            return None
        entry.name = name or entry.name
        self.close(entry, t, state, args)
        return entry

    def close(self, entry: _Open, t: float, state: str, args: dict[str, Any]) -> None:
        merged = entry.args | args
        for track in entry.tracks:
            self.a.spans.append(
                Span(track, entry.cat, entry.name, entry.start, max(t, entry.start), state, merged)
            )

    def feed(self, e: ev.Event) -> None:
        a, t = self.a, e.t
        handler = getattr(self, "on_" + e.event, None)
        if handler is None:  # a type the schema knows but this exporter does not draw yet
            a.unknown[e.event] += 1
            return
        if not _time_ok(t):
            a.invalid_lines += 1
            return
        a.t_min, a.t_max = (t, t) if a.events == 0 else (min(a.t_min, t), max(a.t_max, t))
        a.events += 1
        handler(e)

    def on_measurement_started(self, e: ev.MeasurementStarted) -> None:
        limits = _pick(e, "max_active_trajectories", "max_inflight_model_requests", "cpu_workers")
        self.a.run.update(policy=e.policy, **limits)
        self.instant(("scheduler", 0), "measurement", "measurement started", e.t, {"policy": e.policy})

    def on_measurement_finished(self, e: ev.MeasurementFinished) -> None:
        self.a.run.update(_pick(e, "status", "makespan_s"))
        args = _pick(e, "status", "reason")
        self.instant(("scheduler", 0), "measurement", "measurement finished", e.t, args)

    def on_worker_ready(self, e: ev.WorkerReady) -> None:
        args = _pick(e, "pid", "generation", "startup_s")
        self.instant(self.worker(e.worker), "worker", "worker ready", e.t, args)

    def on_worker_restarting(self, e: ev.WorkerRestarting) -> None:
        args = _pick(e, "reason", "generation", "old_pid", "restarts")
        self.instant(self.worker(e.worker), "worker", f"worker restart: {e.reason}", e.t, args)

    def on_trajectory_started(self, e: ev.TrajectoryStarted) -> None:
        self.begin("trajectory", e.id, (self.traj(e.id),), "running", e.t, {"index": e.index})
        self.active += 1
        self.count("active_trajectories", e.t, self.active)

    def on_trajectory_finished(self, e: ev.TrajectoryFinished) -> None:
        state = "failed" if e.status == "failed" else "ok"
        args = _pick(e, "status", "turns", "tool_calls", "correct", "error")
        if self.end("trajectory", e.id, e.t, state, (self.traj(e.id),), e.status, args):
            self.active = max(0, self.active - 1)
            self.count("active_trajectories", e.t, self.active)

    def on_model_enqueued(self, e: ev.ModelEnqueued) -> None:
        args = _pick(e, "request_id", "turn")
        self.begin("model_queue", e.request_id, (self.traj(e.id),), "model queue", e.t, args)
        self.outstanding.add(e.request_id)
        self.count("model_outstanding", e.t, len(self.outstanding))

    def on_model_started(self, e: ev.ModelStarted) -> None:
        track, args = self.traj(e.id), _pick(e, "request_id", "turn")
        self.end("model_queue", e.request_id, e.t, "ok", (track,), None, args)
        lane = heapq.heappop(self.free_lanes) if self.free_lanes else self.a.model_lanes
        self.a.model_lanes = max(self.a.model_lanes, lane + 1)
        self.lane_of[e.request_id] = lane
        args["trajectory"] = e.id
        self.model_began[e.id] = e.t
        self.begin("model", e.request_id, (track, ("model", lane)), f"model turn {e.turn}", e.t, args)
        self.outstanding.add(e.request_id)
        self.count("model_outstanding", e.t, len(self.outstanding))

    def _model_end(self, e: ev.ModelFinished | ev.ModelFailed, state: str, args: dict[str, Any]) -> None:
        track, rid = self.traj(e.id), e.request_id
        args |= _pick(e, "request_id", "turn", "latency_s")
        queued_only = ("model", rid) not in self.open and ("model_queue", rid) in self.open
        self.end("model_queue" if queued_only else "model", rid, e.t, state, (track,), None, args)
        if (lane := self.lane_of.pop(rid, None)) is not None:
            heapq.heappush(self.free_lanes, lane)
        self.outstanding.discard(rid)
        self.count("model_outstanding", e.t, len(self.outstanding))

    def on_model_finished(self, e: ev.ModelFinished) -> None:
        self._model_end(e, "ok", _pick(e, "action", "prompt_tokens", "completion_tokens"))

    def on_model_failed(self, e: ev.ModelFailed) -> None:
        state = "cancelled" if e.kind == "cancelled" else "failed"  # the stop cut it: not a model error
        self._model_end(e, state, {"error": f"{e.kind}: {e.error}"})

    def on_cpu_enqueued(self, e: ev.CpuEnqueued) -> None:
        self.jobs[e.job_id] = (e.id, e.tool, e.kind)
        args = _pick(e, "job_id", "tool", "kind", "turn")
        self.begin("cpu_queue", e.job_id, (self.traj(e.id),), f"cpu queue: {e.tool}", e.t, args)
        self.depth = e.queue_depth
        self.count("cpu_queue_depth", e.t, self.depth)

    def on_cpu_selected(self, e: ev.CpuSelected) -> None:
        track = self.traj(self.jobs.get(e.job_id, (e.id,))[0])
        args = _pick(e, "job_id", "worker", "reason", "waited_s")
        self.end("cpu_queue", e.job_id, e.t, "ok", (track,), None, args)
        self.depth = max(0, self.depth - 1)
        self.count("cpu_queue_depth", e.t, self.depth)
        if e.reordered:
            args = _pick(e, "job_id", "oldest_job_id", "reason", "queue_depth", "model_outstanding", "policy")
            self.instant(("scheduler", 0), "reorder", f"reorder: {e.reason}", e.t, args)

    def on_cpu_started(self, e: ev.CpuStarted) -> None:
        traj, tool, kind = self.jobs.get(e.job_id, (e.id, "cpu job", "unknown"))
        args = {"tool": tool, "kind": kind} | _pick(e, "job_id", "worker", "pid", "generation")
        self.begin("cpu", e.job_id, (self.traj(traj), self.worker(e.worker)), tool, e.t, args)

    def on_cpu_finished(self, e: ev.CpuFinished) -> None:
        tracks = (self.traj(self.jobs.pop(e.job_id, (e.id,))[0]), self.worker(e.worker))
        state = "ok" if e.ok else "failed"
        args = _pick(e, "job_id", "tool", "kind", "ok", "error", "execute_s", "cpu_s", "roundtrip_s")
        job = self.end("cpu", e.job_id, e.t, state, tracks, e.tool, args)
        started, finished = e.started, e.finished  # the child's own execution, nested in the job
        if started is not None and finished is not None and _time_ok(started) and _time_ok(finished):
            lo, hi = (job.start, e.t) if job else (started, finished)
            start = min(max(started, lo), hi)
            end = max(start, min(finished, hi))
            args = _pick(e, "job_id", "execute_s")
            self.a.spans.append(Span(tracks[1], "execute", "execute", start, end, state, args))

    def on_cpu_failed(self, e: ev.CpuFailed) -> None:
        tracks = (self.traj(self.jobs.pop(e.job_id, (e.id,))[0]), self.worker(e.worker))
        args = _pick(e, "job_id", "tool", "kind", "roundtrip_s") | {
            "ok": False,
            "error": f"{e.reason}: {e.error}",
        }
        state = "cancelled" if e.reason == "cancelled" else "failed"  # the stop cut it: no outcome
        if ("cpu", e.job_id) not in self.open and ("cpu_queue", e.job_id) in self.open:
            self.end("cpu_queue", e.job_id, e.t, state, (), None, args)  # failed before it was selected
            self.depth = max(0, self.depth - 1)
            self.count("cpu_queue_depth", e.t, self.depth)
        else:
            self.end("cpu", e.job_id, e.t, state, tracks, e.tool, args)

    def on_model_retrying(self, e: ev.ModelRetrying) -> None:
        args = _pick(e, "attempt", "kind", "status", "delay_s", "error")
        self.instant(self.traj(e.id), "retry", f"model retry {e.attempt}: {e.kind}", e.t, args)

    def on_model_paused(self, e: ev.ModelPaused) -> None:
        # inside its request's span (clamped there: both ends are rounded to the microsecond); without
        # one, never before the run's first event (a damaged waited_s of 1e308 overflowed both exports)
        start = min(e.t, max(e.t - e.waited_s, self.model_began.get(e.id, self.a.t_min)))
        args = _pick(e, "turn", "attempt", "waited_s")
        self.a.spans.append(
            Span(self.traj(e.id), "circuit", "waiting for the server", start, e.t, "ok", args)
        )

    def on_server_unavailable(self, e: ev.ServerUnavailable) -> None:
        args = _pick(e, "failures", "reason", "opened")
        name = "server unavailable: admission paused"
        self.begin("circuit", 0, (("scheduler", 0),), name, e.t, args)

    def on_server_available(self, e: ev.ServerAvailable) -> None:
        self.end("circuit", 0, e.t, "ok", (("scheduler", 0),), None, _pick(e, "paused_s", "probes"))

    def on_loop_watched(self, e: ev.LoopWatched) -> None:
        pass  # the watch's settings: the summary's; nothing to draw

    def on_loop_stalled(self, e: ev.LoopStalled) -> None:
        # the event loop was held from t - late_s to t: never drawn before the run's first event
        start = min(e.t, max(e.t - e.late_s, self.a.t_min))
        name, args = "event loop stalled", _pick(e, "late_s")
        self.a.spans.append(Span(("scheduler", 0), "loop_stall", name, start, e.t, "ok", args))

    def on_process_stopped(self, e: ev.ProcessStopped) -> None:
        # the process was stopped (Ctrl-Z, SIGSTOP) from t - stopped_s to t: no stall, drawn apart by name
        start = min(e.t, max(e.t - e.stopped_s, self.a.t_min))
        name, args = "process stopped (job control)", _pick(e, "stopped_s")
        self.a.spans.append(Span(("scheduler", 0), "loop_stall", name, start, e.t, "ok", args))

    def on_resource_probe(self, e: ev.ResourceProbe) -> None:
        sources = [s.model_dump(mode="json", exclude={"detail"}) for s in e.sources]
        self.a.telemetry_sources = sources
        available = [s["source"] for s in sources if s["available"]]
        args = {"interval_s": e.interval_s, "available": available} | {
            s["source"]: ("available" if s["available"] else f"unavailable: {s['reason']}") for s in sources
        }
        self.instant(("scheduler", 0), "telemetry", "telemetry probe", e.t, args)

    def on_resource_sample(self, e: ev.ResourceSample) -> None:
        a = self.a
        a.resource_samples += 1
        a.last_sample_t = e.t
        for name in RESOURCE_LABELS:
            value = getattr(e, name)
            if value is not None and math.isfinite(value):
                gap = self.gaps.pop(name, None)
                if gap is not None:
                    gap.end = e.t
                    a.counter_gaps.append(gap)
                self.count(name, e.t, round(value, 6))
                continue
            if not a.counters.get(name):
                continue  # never known yet: nothing is drawn that could be held over
            gap = self.gaps.get(name)
            if gap is None:
                gap = self.gaps[name] = CounterGap(name, e.t, e.t)
                self.count(name, e.t, None)  # the value stops being known here
            gap.samples += 1
            reason = e.nulls.get(name) or ("missing" if value is None else "invalid")
            if reason not in gap.reasons:
                gap.reasons.append(reason)
            if gap.error is None and e.errors:
                gap.error = e.errors[0][:300]

    def finish(self) -> Activity:
        for entry in self.open.values():
            self.close(entry, self.a.t_max, "incomplete", {})
        self.open.clear()
        for gap in self.gaps.values():  # still without a value at the last sample
            gap.end = max(gap.start, self.a.last_sample_t or gap.start)
            self.a.counter_gaps.append(gap)
        self.gaps.clear()
        return self.a


def collect_activity(events_path: Path) -> Activity:
    """Stream ``events.jsonl`` into spans, instants and counters (a missing file gives an empty activity)."""
    pairer = _Pairer(events_path.parent if events_path.parent.is_dir() else None)
    if not events_path.exists():
        pairer.a.run["events_file"] = "missing"
        return pairer.a
    with events_path.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                pairer.feed(ev.parse_event(line))
            except ValidationError:
                try:
                    kind = json_loads(line).get("event")
                except (ValueError, RecursionError, AttributeError):
                    kind = None
                if isinstance(kind, str) and kind not in KNOWN_EVENTS:
                    pairer.a.unknown[kind] += 1
                else:
                    pairer.a.invalid_lines += 1
    return pairer.finish()
