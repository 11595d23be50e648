"""``trace.json``: a run's activity (:mod:`asyncroll.outputs.activity`) as a Chrome Trace Event Format
file that Perfetto and chrome://tracing load.

Chrome's trace format has no way to say a counter is unknown (a counter track holds its last value until
the next point), so ``trace.json`` emits counter points only where known and draws each telemetry gap as a
"no data" slice on a thread of its own under the telemetry process, spanning the null samples.

Perfetto keeps the slices of one thread as a stack and drops a slice that starts inside another and ends
after it, so spans that can cross never share a thread: the event loop's stalls and stops (from the watch's
asked wake-up to its late one) get an "event loop" thread beside the scheduler's, whose server-circuit span
starts when the circuit opened (``server_unavailable`` is back-dated to it) and can cross a stall.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from asyncroll.json_depth import json_loads
from asyncroll.outputs.activity import collect_activity
from asyncroll.outputs.activity_model import COUNTER_LABELS, RESOURCE_LABELS, Activity, Track
from asyncroll.outputs.lines import clear_staged, open_staged, staging_path
from asyncroll.outputs.spool import Spool

Encoder = Callable[[Any], bytes]
#: Events sorted in memory at once; more wait sorted in temporary files (~15 MB per chunk).
SORT_CHUNK = 50_000

#: Which process a counter is drawn under in trace.json (1 trajectories, 2 workers, 3 model, 5 telemetry).
COUNTER_PID = {"cpu_queue_depth": 2, "model_outstanding": 3, "active_trajectories": 1} | dict.fromkeys(
    RESOURCE_LABELS, 5
)


#: How deep a span's kind nests on its track: at equal start and duration the outer one is written first
#: (Perfetto nests a slice in the one before it), whatever order the spans were closed in.
DEPTH = {"trajectory": 0, "execute": 2, "circuit": 2}  # "circuit": a wait inside its model request
#: The scheduler's second thread: the event loop's stalls and stops, which can cross the circuit's span.
LOOP = "event loop"


def _us(t: float, origin: float) -> int:
    return round((t - origin) * 1_000_000)


def _ev(ph: str, name: str, pid: int, tid: int, **fields: Any) -> dict[str, Any]:
    return {"name": name, "ph": ph, "pid": pid, "tid": tid, **fields}


def _thread_label(kind: str, key: Any) -> str:
    if kind == "trajectory":
        return "(no trajectory)" if key is None else f"trajectory {key}"
    if kind == "telemetry":
        return f"no data: {RESOURCE_LABELS.get(key, key)}"
    if kind == "scheduler" and key == LOOP:
        return "event loop"
    return {"worker": f"worker {key}", "model": f"request slot {key}"}.get(kind, "scheduler")


Body = Iterator[tuple[int, int, int, dict[str, Any]]]


def _events(a: Activity) -> tuple[Iterator[dict[str, Any]], Body]:
    """The metadata events and, lazily, ``(ts, dur, depth, event)`` for every other event in the order they
    are sorted from (spans, instants, counters, gaps); ``ts`` 0 is the earliest event of the run."""
    pids = {"trajectory": 1, "worker": 2, "model": 3, "scheduler": 4}
    if any(name in RESOURCE_LABELS and series for name, series in a.counters.items()):
        pids["telemetry"] = 5  # a process only for the counters of the telemetry samples
    tids: dict[Track, int] = {("trajectory", x): i + 1 for i, x in enumerate(a.trajectories)}
    tids |= {("worker", w): i + 1 for i, w in enumerate(sorted(a.workers))}
    tids |= {("model", n): n + 1 for n in range(a.model_lanes)} | {("scheduler", 0): 1}
    if a.spans.loop_spans:
        tids[("scheduler", LOOP)] = 2
    if "telemetry" in pids:  # one thread per counter with gaps, below the counters
        gapped = [k for k in RESOURCE_LABELS if any(g.name == k for g in a.counter_gaps)]
        tids |= {("telemetry", k): i + 1 for i, k in enumerate(gapped)}

    def meta() -> Iterator[dict[str, Any]]:  # lazily: two per trajectory
        for kind, pid in pids.items():
            label = {"trajectory": "trajectories", "worker": "workers", "model": "model requests"}.get(
                kind, kind
            )
            yield _ev("M", "process_name", pid, 0, args={"name": label})
            yield _ev("M", "process_sort_index", pid, 0, args={"sort_index": pid})
        for (kind, key), tid in tids.items():
            yield _ev("M", "thread_name", pids[kind], tid, args={"name": _thread_label(kind, key)})
            yield _ev("M", "thread_sort_index", pids[kind], tid, args={"sort_index": tid})

    def body(o: float) -> Body:
        for s in a.spans:
            track = ("scheduler", LOOP) if s.cat == "loop_stall" else s.track
            ts, pid, tid = _us(s.start, o), pids[track[0]], tids[track]
            args = s.args | ({"state": s.state} if s.state != "ok" else {})
            dur = max(0, _us(s.end, o) - ts)
            event = _ev("X", s.label, pid, tid, cat=s.cat, ts=ts, dur=dur, args=args)
            yield ts, dur, DEPTH.get(s.cat, 1), event
        for s in a.instants:
            scope = "g" if s.cat == "measurement" else "t"
            args = s.args | ({"state": s.state} if s.state != "ok" else {})
            ts, pid, tid = _us(s.start, o), pids[s.track[0]], tids[s.track]
            yield ts, 0, 1, _ev("i", s.label, pid, tid, cat=s.cat, s=scope, ts=ts, args=args)
        for name, series in a.counters.items():
            label, pid = COUNTER_LABELS.get(name) or RESOURCE_LABELS[name], COUNTER_PID[name]
            for t, v in series:
                if v is not None:
                    ts = _us(t, o)
                    yield ts, 0, 1, _ev("C", label, pid, 0, ts=ts, args={"value": v})
        for gap in a.counter_gaps:
            ts, tid = _us(gap.start, o), tids[("telemetry", gap.name)]
            args = {"field": gap.name, "samples": gap.samples, "reasons": gap.reasons}
            if gap.error is not None:
                args["error"] = gap.error
            dur = max(0, _us(gap.end, o) - ts)
            event = _ev("X", gap.label, pids["telemetry"], tid, cat="telemetry", ts=ts, dur=dur, args=args)
            yield ts, dur, 1, event

    return meta(), body(a.t_min)


def _metadata(a: Activity, clock: str | None) -> dict[str, Any]:
    info = {
        "clock": clock,
        "events": a.events,
        "unknown_events": dict(a.unknown),
        "invalid_lines": a.invalid_lines,
        "telemetry_sources": a.telemetry_sources,
        "resource_samples": a.resource_samples,
    }
    return {"source": "asyncroll", "time_origin_s": a.t_min, **info, **a.run}


def _orjson(value: Any) -> bytes:
    return orjson.dumps(value, default=str)


def _stdlib(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def _sorted(events: Body, encode: Encoder, spool: Path) -> Iterator[bytes]:
    """The encoded events sorted by (ts, longest first, outer kind first), ties in their given order
    (counters in order), with memory bounded by ``SORT_CHUNK`` events: an external merge sort whose sorted
    runs wait in temporary files beside the trace; each slice then nested in its track (:func:`_nested`)."""
    runs: list[Spool] = []
    chunk: list[tuple[int, int, int, int, Any, bytes]] = []
    for seq, (ts, dur, depth, event) in enumerate(events):
        track = (event["pid"], event["tid"]) if event["ph"] == "X" else None
        # keys are unique, so the bytes are never compared; copied, as orjson's bytes keep a 4 KB buffer
        chunk.append((ts, -dur, depth, seq, track, bytes(memoryview(encode(event)))))
        if len(chunk) >= SORT_CHUNK:
            chunk.sort()
            run = Spool(spool, batch=256)
            run.extend(chunk)
            runs.append(run)
            chunk = []
    chunk.sort()
    try:
        yield from _nested(heapq.merge(*runs, chunk) if runs else chunk, encode)
    finally:
        for run in runs:
            run.close()


def _nested(items: Iterable[tuple[int, int, int, int, Any, bytes]], encode: Encoder) -> Iterator[bytes]:
    """The events' bytes, each slice (in ts order) ending by the end of the slice it starts in on its
    thread: Perfetto keeps a thread's slices as a stack and drops one that starts inside another and ends
    after it. Only a damaged log makes one (an "(incomplete)" span drawn to the run's end inside a span
    that did end); it is drawn to its enclosing span's end, its own length in ``dur_before_clipping_us``."""
    open_slices: dict[Any, list[tuple[int, int]]] = {}  # per thread: (start, end) of those open at ts
    for ts, minus_dur, _depth, _seq, track, data in items:
        if track is None:
            yield data
            continue
        stack = open_slices.setdefault(track, [])
        while stack and (stack[-1][1] < ts or (stack[-1][1] == ts and (stack[-1][0] < ts or minus_dur))):
            stack.pop()  # ended by ts: closed on the left, open on the right (zero-length ones stack)
        end = ts - minus_dur
        if stack and end > stack[-1][1]:
            event = json.loads(data)
            event["args"] = event.get("args", {}) | {"dur_before_clipping_us": event["dur"]}
            end, event["dur"] = stack[-1][1], stack[-1][1] - ts
            data = encode(event)
        stack.append((ts, end))
        yield data


def _write(path: Path, a: Activity, encode: Encoder, clock: str | None) -> None:
    meta, body = _events(a)
    with open_staged(path, "wb") as out:
        out.write(b'{"traceEvents":[')
        first = True
        for data in itertools.chain(map(encode, meta), _sorted(body, encode, path.parent)):
            out.write(data if first else b"," + data)
            first = False
        out.write(b'],"displayTimeUnit":"ms","metadata":' + encode(_metadata(a, clock)) + b"}")


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half an export."""
    tmp = staging_path(path)
    try:
        with open_staged(tmp, "w") as out:
            out.write(text)
        os.replace(tmp, path)
        clear_staged(path)
    except BaseException:  # a full disk: no half-written temporary file left beside the run
        tmp.unlink(missing_ok=True)
        raise


def _clock(receipt: Path) -> str | None:
    """What the trace's times are, as run.json says: ``virtual`` (a simulation), ``monotonic`` (measured),
    or None when it cannot be read."""
    try:
        simulated = json_loads(receipt.read_bytes()).get("simulated")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return None if not isinstance(simulated, bool) else "virtual" if simulated else "monotonic"


def write_trace(run_dir: Path, activity: Activity | None = None) -> Path:
    """Write ``run_dir/trace.json`` from ``run_dir/events.jsonl`` (or its already collected
    ``activity``); returns its path. The file is streamed, one event at a time, in the bytes that encoding
    the whole object at once gave: orjson (~5x faster on a 100k-event run), or the stdlib for the whole file
    when orjson refuses a value (ints beyond 64 bits)."""
    path = run_dir / "trace.json"
    a = activity or collect_activity(run_dir / "events.jsonl")
    clock = _clock(run_dir / "run.json")
    tmp = staging_path(path)
    try:
        try:
            _write(tmp, a, _orjson, clock)
        except TypeError:
            _write(tmp, a, _stdlib, clock)
        os.replace(tmp, path)
        clear_staged(path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed export leaves no half-written file behind
    return path
