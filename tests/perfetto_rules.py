"""An independent checker of the rules Perfetto's JSON importer applies to a ``trace.json``, written from
its trace processor's source rather than from the exporter (which it must not trust):

- ``json_trace_parser.cc`` (``ParseJsonPacket``): pid/tid are unsigned 32-bit integers; an ``X`` event
  without a numeric ``dur`` counts a ``json_parser_failure`` and is dropped; a ``C`` event's args must be
  an object whose values are numbers (or numeric strings): a null, bool or object value is dropped with a
  ``json_parser_failure``; each arg is its own counter track named ``"<name> <key>"`` of the event's
  process; instants take scope ``g``, ``p`` or ``t`` (anything else is dropped); ``b``/``e`` need a pid and
  an ``id`` or ``id2``; ``M`` ``thread_name``/``process_name`` need a non-empty ``args.name``.
- ``slice_tracker.cc`` (``MaybeCloseStack``): on one (pid, tid) track slices are a stack, intervals closed
  on the left and open on the right: an open slice ending at or before the next slice's start is popped
  (two zero-length slices at one instant stack); a slice that starts inside the top slice and ends after
  it is dropped (``slice_drop_overlapping_complete_event``); an ``E`` closes the innermost open ``B``, and
  an ``E`` with none open is lost; a negative ``dur`` is an import error.
- JSON itself (RFC 8259): no ``NaN``/``Infinity`` literals.
- The exporter's own contract (``asyncroll.outputs.trace``): ``ts`` 0 is the run's earliest event, so no
  ``ts`` is negative (``CoerceToTs`` itself would take one).

Events are replayed in the order the importer sorts them: by ``ts`` (the file order among equal ``ts``,
which is why the exporter must already write a parent before the children that share its start).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

UINT32 = 2**32
SLICE_PHASES = {"X", "B", "E", "i", "I"}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-JSON literal {name}")


def load_strict(path: Path) -> dict[str, Any]:
    """The file as strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are refused."""
    data: dict[str, Any] = json.loads(path.read_bytes(), parse_constant=_reject_constant)
    return data


class _Track:
    """One thread track's slice stack: (start, end, name); end None for an open ``B``."""

    def __init__(self) -> None:
        self.stack: list[tuple[int, int | None, str]] = []

    def start(self, ts: int, dur: int | None, name: str) -> str | None:
        """Push a slice as ``MaybeCloseStack`` does; the reason it is dropped, or None."""
        while self.stack:
            s, end, top = self.stack[-1]
            if end is None:
                break  # an open B: nothing above it can be popped past it by a start
            if end < ts or (end == ts and not (end == s and dur == 0)):
                self.stack.pop()
                continue
            if dur is not None and ts < end < ts + dur:
                return f"partially overlaps {top!r} [{s}, {end}]"
            break
        for s, end, top in self.stack:  # every enclosing closed slice must hold it too
            if end is not None and dur is not None and ts + dur > end:
                return f"ends after its ancestor {top!r} [{s}, {end}]"
        self.stack.append((ts, None if dur is None else ts + dur, name))
        return None

    def end(self, ts: int) -> str | None:
        for i in range(len(self.stack) - 1, -1, -1):
            s, end, name = self.stack[i]
            if end is None:
                if ts < s:
                    return f"E before its B {name!r} at {s}"
                del self.stack[i:]
                return None
        return "E without an open B"


def perfetto_problems(trace: dict[str, Any]) -> list[str]:
    """Every way ``trace`` breaks a rule above (empty: Perfetto imports every event as written)."""
    out: list[str] = []
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    named_pids: set[int] = set()
    named_threads: set[tuple[int, int]] = set()
    used_pids: set[int] = set()
    used_threads: set[tuple[int, int]] = set()
    counter_pids: dict[str, set[int]] = defaultdict(set)
    body: list[tuple[int, int, dict[str, Any]]] = []
    for n, e in enumerate(events):
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid")
        where = f"event {n} {e.get('name')!r} ({ph})"
        if not isinstance(ph, str) or not ph:
            out.append(f"{where}: no phase")
            continue
        for key, v in (("pid", pid), ("tid", tid)):
            if not (_integer(v) and 0 <= v < UINT32):
                out.append(f"{where}: {key} {v!r} is not an unsigned 32-bit integer")
        if not isinstance(e.get("name"), str) or not e["name"]:
            out.append(f"{where}: no name")
        if ph == "M":
            name, args = e.get("name"), e.get("args")
            if not isinstance(args, dict):
                out.append(f"{where}: metadata without args")
                continue
            if name in ("process_name", "thread_name"):
                if not isinstance(args.get("name"), str) or not args["name"]:
                    out.append(f"{where}: empty {name}")
                if name == "process_name":
                    named_pids.add(pid)
                else:
                    named_threads.add((pid, tid))
            elif name in ("process_sort_index", "thread_sort_index") and not _integer(args.get("sort_index")):
                out.append(f"{where}: sort_index {args.get('sort_index')!r} is not an integer")
            continue
        ts = e.get("ts")
        if not _number(ts) or ts < 0:
            out.append(f"{where}: ts {ts!r} is not a finite, non-negative number of microseconds")
            continue
        used_pids.add(pid)
        if ph == "X":
            dur = e.get("dur")
            if not _number(dur):
                out.append(f"{where}: dur {dur!r} is not a finite number (the slice is dropped)")
                continue
            if dur < 0:
                out.append(f"{where}: negative dur {dur}")
                continue
        if ph in ("i", "I", "R") and e.get("s", "t") not in ("g", "p", "t"):
            out.append(f"{where}: instant scope {e.get('s')!r}")
        if ph in SLICE_PHASES and (ph not in ("i", "I") or e.get("s", "t") == "t"):
            used_threads.add((pid, tid))
        if ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args:
                out.append(f"{where}: counter without args")
            else:
                for key, v in args.items():
                    if not _number(v):
                        out.append(f"{where}: counter value {key}={v!r} is dropped")
                    counter_pids[f"{e['name']} {key}"].add(pid)
        if ph in ("b", "e", "n", "S", "F") and "id" not in e and "id2" not in e:
            out.append(f"{where}: async event without id")
        body.append((ts, n, e))
    order = [b[1] for b in body]
    if order != [b[1] for b in sorted(body, key=lambda b: b[0])]:
        out.append("events are not in ts order (the importer re-sorts, so equal-ts ties may reorder)")
    tracks: dict[tuple[int, int], _Track] = defaultdict(_Track)
    async_open: dict[tuple[Any, ...], int] = defaultdict(int)
    for ts, n, e in sorted(body, key=lambda b: b[0]):
        ph, thread = e["ph"], (e["pid"], e["tid"])
        where = f"event {n} {e['name']!r} ({ph}) on {thread} at {ts}"
        problem = None
        if ph == "X":
            problem = tracks[thread].start(ts, e["dur"], e["name"])
        elif ph == "B":
            problem = tracks[thread].start(ts, None, e["name"])
        elif ph == "E":
            problem = tracks[thread].end(ts)
        elif ph in ("i", "I") and e.get("s", "t") == "t":
            problem = tracks[thread].start(ts, 0, e["name"])
        elif ph in ("b", "e"):
            cookie = (e["pid"], e.get("cat"), json.dumps(e.get("id", e.get("id2"))), e["name"])
            if ph == "b":
                async_open[cookie] += 1
            elif async_open[cookie] == 0:
                problem = "async end without a begin"
            else:
                async_open[cookie] -= 1
        if problem:
            out.append(f"{where}: {problem}")
    for thread, track in tracks.items():
        out += [f"B {name!r} on {thread} at {s} never ends" for s, end, name in track.stack if end is None]
    out += [f"async {c} has {k} unmatched begin(s)" for c, k in async_open.items() if k]
    out += [f"pid {p} has events but no process_name" for p in sorted(used_pids - named_pids)]
    out += [f"thread {t} has slices but no thread_name" for t in sorted(used_threads - named_threads)]
    out += [f"counter {c!r} split over processes {sorted(p)}" for c, p in counter_pids.items() if len(p) > 1]
    return out
