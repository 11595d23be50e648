"""``trace.json``: a run's activity (:mod:`asyncroll.outputs.activity`) as a Chrome Trace Event Format
file that Perfetto and chrome://tracing load.

Chrome's trace format has no way to say a counter is unknown (a counter track holds its last value until
the next point), so ``trace.json`` emits counter points only where known and draws each telemetry gap as a
"no data" slice on a thread of its own under the telemetry process, spanning the null samples.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson

from asyncroll.outputs.activity import COUNTER_LABELS, RESOURCE_LABELS, Activity, Track, collect_activity

#: Which process a counter is drawn under in trace.json (1 trajectories, 2 workers, 3 model, 5 telemetry).
COUNTER_PID = {"cpu_queue_depth": 2, "model_outstanding": 3, "active_trajectories": 1} | dict.fromkeys(
    RESOURCE_LABELS, 5
)


def _us(t: float, origin: float) -> int:
    return round((t - origin) * 1_000_000)


def _ev(ph: str, name: str, pid: int, tid: int, **fields: Any) -> dict[str, Any]:
    return {"name": name, "ph": ph, "pid": pid, "tid": tid, **fields}


def _thread_label(kind: str, key: Any) -> str:
    if kind == "trajectory":
        return "(no trajectory)" if key is None else f"trajectory {key}"
    if kind == "telemetry":
        return f"no data: {RESOURCE_LABELS.get(key, key)}"
    return {"worker": f"worker {key}", "model": f"request slot {key}"}.get(kind, "scheduler")


def chrome_trace(a: Activity) -> dict[str, Any]:
    """The Trace Event Format object for an :class:`Activity`; ``ts`` 0 is the earliest event of the run."""
    pids = {"trajectory": 1, "worker": 2, "model": 3, "scheduler": 4}
    if any(name in RESOURCE_LABELS and series for name, series in a.counters.items()):
        pids["telemetry"] = 5  # a process only for the counters of the telemetry samples
    tids: dict[Track, int] = {("trajectory", x): i + 1 for i, x in enumerate(a.trajectories)}
    tids |= {("worker", w): i + 1 for i, w in enumerate(sorted(a.workers))}
    tids |= {("model", n): n + 1 for n in range(a.model_lanes)} | {("scheduler", 0): 1}
    if "telemetry" in pids:  # one thread per counter with gaps, below the counters
        gapped = [k for k in RESOURCE_LABELS if any(g.name == k for g in a.counter_gaps)]
        tids |= {("telemetry", k): i + 1 for i, k in enumerate(gapped)}
    meta: list[dict[str, Any]] = []
    for kind, pid in pids.items():
        label = {"trajectory": "trajectories", "worker": "workers", "model": "model requests"}.get(kind, kind)
        meta.append(_ev("M", "process_name", pid, 0, args={"name": label}))
        meta.append(_ev("M", "process_sort_index", pid, 0, args={"sort_index": pid}))
    for (kind, key), tid in tids.items():
        meta.append(_ev("M", "thread_name", pids[kind], tid, args={"name": _thread_label(kind, key)}))
        meta.append(_ev("M", "thread_sort_index", pids[kind], tid, args={"sort_index": tid}))
    o = a.t_min
    body: list[dict[str, Any]] = []
    for s in a.spans:
        ts, pid, tid = _us(s.start, o), pids[s.track[0]], tids[s.track]
        args = s.args | ({"state": s.state} if s.state != "ok" else {})
        dur = max(0, _us(s.end, o) - ts)
        body.append(_ev("X", s.label, pid, tid, cat=s.cat, ts=ts, dur=dur, args=args))
    for s in a.instants:
        scope = "g" if s.cat == "measurement" else "t"
        args = s.args | ({"state": s.state} if s.state != "ok" else {})
        ts, pid, tid = _us(s.start, o), pids[s.track[0]], tids[s.track]
        body.append(_ev("i", s.label, pid, tid, cat=s.cat, s=scope, ts=ts, args=args))
    for name, series in a.counters.items():
        label, pid = COUNTER_LABELS.get(name) or RESOURCE_LABELS[name], COUNTER_PID[name]
        body += [_ev("C", label, pid, 0, ts=_us(t, o), args={"value": v}) for t, v in series if v is not None]
    for gap in a.counter_gaps:
        ts, tid = _us(gap.start, o), tids[("telemetry", gap.name)]
        args = {"field": gap.name, "samples": gap.samples, "reasons": gap.reasons}
        if gap.error is not None:
            args["error"] = gap.error
        dur = max(0, _us(gap.end, o) - ts)
        body.append(_ev("X", gap.label, pids["telemetry"], tid, cat="telemetry", ts=ts, dur=dur, args=args))
    body.sort(key=lambda x: (x["ts"], -x.get("dur", 0)))  # stable: parents before children, counters in order
    info = {
        "events": a.events,
        "unknown_events": dict(a.unknown),
        "invalid_lines": a.invalid_lines,
        "telemetry_sources": a.telemetry_sources,
        "resource_samples": a.resource_samples,
    }
    metadata = {"source": "asyncroll", "time_origin_s": o, **info, **a.run}
    return {"traceEvents": meta + body, "displayTimeUnit": "ms", "metadata": metadata}


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half an export."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_trace(run_dir: Path, activity: Activity | None = None) -> Path:
    """Write ``run_dir/trace.json`` from ``run_dir/events.jsonl`` (or its already collected
    ``activity``); returns its path."""
    path = run_dir / "trace.json"
    trace = chrome_trace(activity or collect_activity(run_dir / "events.jsonl"))
    try:  # orjson: ~5x faster on a 100k-event run; the stdlib for what it refuses (ints beyond 64 bits)
        text = orjson.dumps(trace, default=str).decode()
    except TypeError:
        text = json.dumps(trace, separators=(",", ":"), default=str)
    write_atomic(path, text)
    return path
