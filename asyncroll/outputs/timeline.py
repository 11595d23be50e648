"""``timeline.html``: one self-contained page that draws a run's trajectories, workers and counters.

The page needs no network (inline script and style, a Content-Security-Policy that forbids fetching
anything) so it can be mailed or archived with the run. It draws the same spans as ``trace.json`` (both come
from :func:`asyncroll.outputs.activity.collect_activity`) on a ``<canvas>`` with wheel zoom and drag pan. The
data sits in a ``<script type="application/json">`` block with ``<``, ``>`` and ``&`` escaped, so no value
(a trajectory id such as ``</script>``) can end the block early. Large runs are down-sampled, never silently
truncated: past ``MAX_SPANS`` the trajectory spans (unless they alone are too many) and failed, cancelled
or incomplete spans (up to that limit) stay individual, the rest are merged per row into bars (spans
closer than about a pixel at full view); long counter lines keep each bucket's maximum and last value;
past ``MAX_INSTANTS`` markers (scheduler reorders first) are thinned evenly over the run; the page says
what stayed exact and what was merged or thinned. A telemetry counter's line is broken wherever its
samples were null (the page never holds the last good value across a gap), and the telemetry section
lists those gaps.
The header's and the telemetry section's text come from :mod:`asyncroll.outputs.timeline_panels`.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from array import array
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from asyncroll.json_depth import read_json_object
from asyncroll.outputs.activity import collect_activity
from asyncroll.outputs.activity_model import COUNTER_LABELS, RESOURCE_LABELS, Activity, Series, Span, Track
from asyncroll.outputs.timeline_panels import header_lines, telemetry_panel
from asyncroll.outputs.trace import write_atomic

MAX_SPANS = 20_000
MAX_INSTANTS = 20_000
MAX_TRAJECTORY_ROWS = 4_000
SHARED_FIRST_ABOVE = 200  # trajectory rows beyond which workers and request slots are drawn on top
MAX_COUNTER_POINTS = 4_000
MAX_BARS = 30_000
UNMEASURED_WINDOW_S = 1.0  # the page's first view of a run that stopped before measuring, at least
BUCKETS = 1_000  # at full view, spans closer than 1/BUCKETS of the run merge when down-sampled
CATS = ("trajectory", "model_queue", "model", "cpu_queue", "cpu", "execute", "circuit", "loop_stall")
#: span states, least severe first: a bar of merged spans shows the most severe of them
STATES = ("ok", "cancelled", "failed", "incomplete", "unmatched")
#: every counter, in the order of the page's palette: a counter's colour is its place here
COUNTER_COLOURS = (*COUNTER_LABELS, *RESOURCE_LABELS)
_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}


def _rows(a: Activity) -> tuple[list[list[Any]], dict[Track, int], int]:
    """Row labels (label, group) and the row of every track; huge runs put several trajectories per row.

    Trajectories come first, then workers, request slots and the scheduler; past ``SHARED_FIRST_ABOVE``
    trajectory rows the shared tracks go on top, where they are seen without scrolling past thousands of rows.
    """
    per = max(1, math.ceil(len(a.trajectories) / MAX_TRAJECTORY_ROWS))
    traj_rows: list[list[Any]] = []
    traj_index: dict[Track, int] = {}
    for i, tid in enumerate(a.trajectories):
        if i % per == 0:
            last = min(i + per, len(a.trajectories))
            label = "(no trajectory)" if tid is None else str(tid)
            traj_rows.append([label if per == 1 else f"trajectories {i + 1}-{last}", 0])
        traj_index[("trajectory", tid)] = len(traj_rows) - 1
    tracks = [("worker", w) for w in sorted(a.workers)] + [("model", n) for n in range(a.model_lanes)]
    shared_rows: list[list[Any]] = []
    shared_index: dict[Track, int] = {}
    for kind, key in [*tracks, ("scheduler", 0)]:
        shared_index[(kind, key)] = len(shared_rows)
        label = {"worker": f"worker {key}", "model": f"request slot {key}"}.get(kind, "scheduler")
        shared_rows.append([label, {"worker": 1, "model": 2}.get(kind, 3)])
    if len(traj_rows) > SHARED_FIRST_ABOVE:
        first, then = (shared_rows, shared_index), (traj_rows, traj_index)
    else:
        first, then = (traj_rows, traj_index), (shared_rows, shared_index)
    offset = len(first[0])
    index = first[1] | {track: row + offset for track, row in then[1].items()}
    return first[0] + then[0], index, per


class _Rest:
    """The spans merged into bars, as much as merging needs: per row and kind (in order of first
    appearance), their starts, ends and states in arrays (17 bytes a span)."""

    def __init__(self, index: dict[Track, int]) -> None:
        self.index = index
        self.groups: dict[tuple[int, int], tuple[array[float], array[float], bytearray]] = {}
        self.count = 0

    def add(self, s: Span) -> None:
        key = (self.index[s.track], CATS.index(s.cat))
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = (array("d"), array("d"), bytearray())
        group[0].append(s.start)
        group[1].append(s.end)
        group[2].append(STATES.index(s.state))
        self.count += 1


def _aggregate(rest: _Rest, t0: float, gap: float) -> tuple[list[list[int]], float]:
    """Merge spans of one row and kind that lie closer than ``gap`` into bars; widen ``gap`` until few enough.

    A bar is ``[row, start µs, end µs, kind, worst state, spans merged, % of the bar busy]``. Merging (rather
    than fixed buckets) keeps a long queue wait one bar however many buckets it crosses.
    """
    import numpy as np  # only a run too large to draw span by span gets here (≈ 0.2 s to import)

    groups: dict[tuple[int, int], tuple[np.ndarray[Any, Any], ...]] = {}
    for key, columns in rest.groups.items():  # each group by start, ties in their order
        starts, ends, states = columns
        starts_np = np.frombuffer(starts, dtype=np.float64)
        order = np.argsort(starts_np, kind="stable")
        groups[key] = (
            starts_np[order],
            np.frombuffer(ends, dtype=np.float64)[order],
            np.frombuffer(states, dtype=np.uint8)[order],
        )
    while True:
        bars: list[list[int]] = []
        for (row, cat), ordered in groups.items():
            items = list(zip(*(c.tolist() for c in ordered), strict=True))  # Python floats: the same sums
            lo, hi, busy, worst, n = items[0][0], items[0][1], 0.0, 0, 0
            for item in [*items, None]:
                if item is not None and item[0] <= hi + gap:
                    hi, busy, n = max(hi, item[1]), busy + item[1] - item[0], n + 1
                    worst = max(worst, item[2])
                    continue
                pct = 100 if hi <= lo else min(100, max(1, round(100 * busy / (hi - lo))))
                bars.append([row, round((lo - t0) * 1e6), round((hi - t0) * 1e6), cat, worst, n, pct])
                if item is not None:
                    lo, hi, busy, n = item[0], item[1], item[1] - item[0], 1
                    worst = item[2]
        if len(bars) <= MAX_BARS or len(bars) == len(groups):  # one bar per row and kind is the floor
            return bars, gap
        gap *= 2


def _thin(series: Series, t0: float) -> list[list[Any]]:
    """Counter points in µs since ``t0``; long series keep each bucket's maximum and its last value.
    A ``None`` point (the value unknown from there on) is always kept, so a gap never closes."""
    points = ([round((t - t0) * 1e6), v] for t, v in series)
    if len(series) <= MAX_COUNTER_POINTS:
        return list(points)
    step, out = math.ceil(len(series) / (MAX_COUNTER_POINTS // 2)), []
    while bucket := list(itertools.islice(points, step)):
        run: list[list[Any]] = []
        for point in [*bucket, None]:
            if point is not None and point[1] is not None:
                run.append(point)
                continue
            if run:  # a run of known values: its maximum at its start, then its last value
                out += [[run[0][0], max(v for _, v in run)], run[-1]]
                run = []
            if point is not None:
                out.append(point)
    return out


def _window(a: Activity) -> list[float]:
    """The measured window in seconds after ``t_min``: the page opens on it (worker start-up before the
    clock can be seconds long and would squeeze the run into a sliver); the whole run is a click away."""
    starts = [s.start for s in a.instants if s.name == "measurement started"]
    if not starts and a.t_max - a.t_min < UNMEASURED_WINDOW_S:  # stopped before measuring: start-up markers
        return [0.0, UNMEASURED_WINDOW_S]  # µs apart drew an axis of '-8.263018 s' ... '-8.262988 s'
    lo = starts[0] if starts else a.t_min
    makespan = a.run.get("makespan_s")  # measurement_finished comes after cleanup; the makespan does not
    hi = lo + makespan if isinstance(makespan, int | float) and makespan > 0 else a.t_max
    hi = min(a.t_max, hi + 0.02 * (hi - lo))  # a little air after the last span
    if hi <= lo:
        lo, hi = a.t_min, a.t_max
    return [round(lo - a.t_min, 6), round(max(hi - a.t_min, lo - a.t_min + 1e-6), 6)]


def _instants(a: Activity) -> tuple[list[Span], str | None]:
    """The markers drawn, at most ``MAX_INSTANTS``: all but scheduler reorders first, then as many reorders
    as fit. A kind with more keeps every k-th of its markers, evenly over the run (keeping the first ones
    cut the run's end off: no reorder drawn in the batch's tail); the page's note says so (None: all drawn).
    """
    reorders = sum(s.cat == "reorder" for s in a.instants)
    counts = (len(a.instants) - reorders, reorders)  # other markers, reorders
    room = min(counts[0], MAX_INSTANTS)
    keep = (room, min(reorders, MAX_INSTANTS - room))
    kept: tuple[list[Span], list[Span]] = ([], [])
    seen = [0, 0]
    for s in a.instants:
        kind = int(s.cat == "reorder")
        i, n, k = seen[kind], counts[kind], keep[kind]
        seen[kind] += 1
        if (i + 1) * k // n > i * k // n:  # the i-th of n, when k of them are kept evenly (all: k == n)
            kept[kind].append(s)
    thinned = [
        f"{label} thinned evenly over the run ({k:,} of {n:,})"
        for label, n, k in zip(("other markers", "scheduler reorders"), counts, keep, strict=True)
        if k < n
    ]
    note = f"{sum(keep):,} of {len(a.instants):,} markers drawn: {'; '.join(thinned)}." if thinned else None
    return kept[0] + kept[1], note


def gap_text(seconds: float) -> str:
    """``1,850 ms`` (not 1.85e+03), ``2.5 ms``, ``40 µs``; times are whole µs, so no gap is under 1 µs
    (a near-zero simulated makespan gave "gaps under 1e-06 ms")."""
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{max(ms * 1e3, 1.0):.3g} µs"


def timeline_data(
    run_dir: Path, activity: Activity | None = None, final: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Everything the page draws, as plain JSON: header, rows, spans, cells, instants, counters, notes.
    ``final``: receipt fields about to be written (the run's final status), overriding run.json's."""
    a = activity or collect_activity(run_dir / "events.jsonl")
    run = read_json_object(run_dir / "run.json") or {}
    summary = read_json_object(run_dir / "summary.json") or {}
    if final:
        run = {**run, **final}
    rows, index, per = _rows(a)
    t0 = a.t_min
    strings: dict[str, int] = {}

    def s_id(text: Any) -> int:
        return strings.setdefault(str(text), len(strings))

    def label(s: Span) -> str:  # a row of several trajectories: its spans say whose they are
        return f"{s.track[1]}: {s.label}" if per > 1 and s.track[0] == "trajectory" else s.label

    # Past MAX_SPANS: the trajectory spans (unless even they are too many), then the first failed or
    # incomplete ones of the others, stay individual; the rest are merged into bars. One pass over the spans.
    spans: list[Span] = []
    bad: list[Span] = []
    rest = _Rest(index)
    own_row, bad_merged = True, 0
    if len(a.spans) <= MAX_SPANS:
        spans = list(a.spans)
    else:
        own_row = a.spans.trajectory_spans <= MAX_SPANS
        room = MAX_SPANS - (a.spans.trajectory_spans if own_row else 0)
        for s in a.spans:
            if own_row and s.cat == "trajectory":
                spans.append(s)
            elif s.state != "ok" and len(bad) < room:
                bad.append(s)
            else:
                bad_merged += s.state != "ok"
                rest.add(s)
        spans += bad
    gap = max(a.t_max - t0, 1e-6) / BUCKETS
    bars, gap = _aggregate(rest, t0, gap) if rest.count else ([], 0.0)
    spans = sorted(spans, key=lambda s: s.cat != "trajectory")
    instants, thinned_instants = _instants(a)
    notes = [f"{len(spans):,} of {len(a.spans):,} spans drawn individually."]
    if rest.count:
        exact = "Trajectory spans and failed" if own_row else "Trajectory spans are in them too; failed"
        more = f" (the first {len(bad):,}; {bad_merged:,} more merged into the bars)" if bad_merged else ""
        notes.append(
            f"Down-sampled: the other {rest.count:,} spans are merged into {len(bars):,} bars (same row and"
            f" kind, gaps under {gap_text(gap)}; shade = share of the bar"
            f" busy). {exact}, cancelled and incomplete spans stay exact{more}."
        )
    labels = {k: COUNTER_LABELS.get(k) or RESOURCE_LABELS[k] for k in a.counters}
    thinned = [
        f"{labels[k]} ({len(v):,} points)" for k, v in a.counters.items() if len(v) > MAX_COUNTER_POINTS
    ]
    if thinned:
        notes.append(f"Counters thinned to each bucket's maximum and last value: {', '.join(thinned)}.")
    if per > 1:
        notes.append(f"{len(a.trajectories):,} trajectories: {per} per row, in order of start.")
    if thinned_instants is not None:
        notes.append(thinned_instants)
    if a.unknown or a.invalid_lines:
        kinds = ", ".join(f"{k} ({n})" for k, n in a.unknown.items()) or "none"
        notes.append(f"Skipped lines: unknown event types: {kinds}; invalid lines: {a.invalid_lines}.")
    if a.run.get("events_file") == "missing":
        notes.append("events.jsonl is missing: nothing to draw.")
    return {
        "header": header_lines(a, run, summary),
        "notes": notes,
        "telemetry": telemetry_panel(a, run, summary),
        "t0": t0,
        "t1": a.t_max,
        "window": _window(a),
        "cats": CATS,
        "states": STATES,
        "groups": ["trajectories", "workers", "model request slots", "scheduler"],
        "rows": rows,
        "spans": [
            [
                index[s.track],
                round((s.start - t0) * 1e6),
                round((s.end - s.start) * 1e6),
                CATS.index(s.cat),
                STATES.index(s.state),
                s_id(label(s)),
                s_id(s.args["error"]) if s.args.get("error") else -1,
            ]
            for s in spans
        ],
        "bars": bars,
        "instants": [
            [index[s.track], round((s.start - t0) * 1e6), s_id(s.cat), STATES.index(s.state), s_id(label(s))]
            for s in instants
        ],
        "counters": [[labels[k], _thin(v, t0)] for k, v in a.counters.items() if v],
        # each counter's colour by its name, not its place: the same in every run's page
        "counter_colours": [COUNTER_COLOURS.index(k) for k, v in a.counters.items() if v],
        "strings": list(strings),
        "total_spans": len(a.spans),
    }


def render_html(data: dict[str, Any]) -> str:
    """The page for :func:`timeline_data`'s output, with the data escaped for an inline script block."""
    payload = json.dumps(data, separators=(",", ":"), default=str).translate(_ESCAPES)
    return _page().replace("__DATA__", payload)


@functools.cache
def _page() -> str:
    """The page template (``timeline.html`` beside this module, package data): HTML, CSS and the script
    that draws the data, with ``__DATA__`` where the JSON goes."""
    return resources.files("asyncroll.outputs").joinpath("timeline.html").read_text(encoding="utf-8")


def write_timeline(
    run_dir: Path, activity: Activity | None = None, final: Mapping[str, Any] | None = None
) -> Path:
    """Write ``run_dir/timeline.html`` from the run's events (or their collected ``activity``),
    ``run.json`` (or the ``final`` status about to be written to it) and ``summary.json``."""
    path = run_dir / "timeline.html"
    write_atomic(path, render_html(timeline_data(run_dir, activity, final)))
    return path
