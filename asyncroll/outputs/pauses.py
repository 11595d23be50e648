"""Time a run could make no progress for reasons outside its schedule, for ``summary.json``.

Two meters, each fed its events by :class:`~asyncroll.outputs.summary.SummaryBuilder`:

* :class:`CircuitMeter`: the HTTP backend's server circuit (``server_unavailable`` → ``server_available``):
  how often it opened, how long admission was paused inside the measured window, and the waits of requests
  that found it open (inside their latency). The ``model.circuit`` section.
* :class:`LoopStallMeter`: stalls of the client's event loop (``loop_stalled``): while the loop was held (a
  blocking call on it: a slow write, a long computation; more work than it could run; a machine with no CPU
  to spare for the client), admission, dispatch and the reading of responses waited for it, whatever the
  schedule; a summary that only knew queues and latencies blamed that time on them. The ``event_loop``
  section; null figures where the loop was not watched (a simulation: its clock is virtual; a file written
  before the watch existed). Stops of the whole process (job control: ``process_stopped``) are counted
  apart from the stalls: the makespan includes them, as it is the wall time, and the section says how much.
"""

from __future__ import annotations

from typing import Any

from asyncroll.events import (
    LoopStalled,
    LoopWatched,
    MeasurementStarted,
    ModelPaused,
    ProcessStopped,
    ServerAvailable,
    ServerUnavailable,
)

#: A run whose event loop stalled for at least this fraction of its makespan, and this many seconds, is
#: warned about on stderr (a single 0.1 s hiccup of a loaded machine in a 1 s run is not worth a warning).
STALLED_WARNING_FRACTION = 0.05
STALLED_WARNING_S = 0.5


class CircuitMeter:
    def __init__(self) -> None:
        # (opened at, closed at or None) per opening, and the waits of requests that found it open
        self.spans: list[list[float | None]] = []
        self.waits = 0
        self.wait_s = 0.0

    def on_paused(self, event: ModelPaused) -> None:
        self.waits += 1
        self.wait_s += event.waited_s

    def on_unavailable(self, event: ServerUnavailable) -> None:
        self.spans.append([event.t, None])

    def on_available(self, event: ServerAvailable) -> None:
        if self.spans and self.spans[-1][1] is None:
            self.spans[-1][1] = event.t

    def build(self, makespan_s: float | None) -> dict[str, Any]:
        """How often the server circuit opened and how long admission was paused inside the measured
        window (an opening still open at the end counts up to the end of the window)."""
        paused: float | None = None
        if makespan_s is not None:
            paused = 0.0
            for opened, closed in self.spans:
                assert opened is not None
                end = makespan_s if closed is None else min(closed, makespan_s)
                paused += max(0.0, end - max(opened, 0.0))
        return {
            "opened": len(self.spans),
            "paused_s": None if paused is None else round(paused, 6),
            "open_at_end": bool(self.spans) and self.spans[-1][1] is None,
            "requests_waited": self.waits,
            "request_wait_s": round(self.wait_s, 6),
        }


class LoopStallMeter:
    def __init__(self) -> None:
        self.threshold_s: float | None = None  # from loop_watched: None, the loop was not watched
        self._spans: list[tuple[float, float]] = []  # (began, ended), clipped to the window at the end
        self._stops: list[tuple[float, float]] = []  # likewise, of the process's stops (job control)
        self._opened = False  # measurement_started was read: the window opened

    def on_started(self, event: MeasurementStarted) -> None:
        self._opened = True

    def on_watched(self, event: LoopWatched) -> None:
        self.threshold_s = event.stall_s

    def on_stalled(self, event: LoopStalled) -> None:
        self._spans.append((event.t - event.late_s, event.t))

    def on_stopped(self, event: ProcessStopped) -> None:
        self._stops.append((event.t - event.stopped_s, event.t))

    def build(self, makespan_s: float | None) -> dict[str, Any]:
        """Stalls of the event loop inside the measured window: how many, their total and the longest.
        Null figures when the loop was not watched or the window never opened."""
        watched = self.threshold_s is not None
        base: dict[str, Any] = {"watched": watched, "stall_threshold_s": self.threshold_s}
        if not watched or makespan_s is None:
            if watched or not self._opened:
                why = "the window never opened"
            else:
                why = "not watched (a simulation, or an older run)"
            nulls = dict.fromkeys(
                (
                    "stalls",
                    "stalled_s",
                    "longest_stall_s",
                    "fraction_of_makespan",
                    "stops",
                    "stopped_s",
                    "stopped_fraction_of_makespan",
                )
            )
            return base | nulls | {"note": why}
        lengths = _inside(self._spans, makespan_s)
        stops = _inside(self._stops, makespan_s)
        stopped = ""
        if stops:
            stopped = (
                f"; besides, the process was stopped (job control: Ctrl-Z, SIGSTOP) {len(stops)} time(s), "
                f"{sum(stops):.3f} s in all: no stall, but inside the makespan (the wall time) all the same"
            )
        return base | {
            "stalls": len(lengths),
            "stalled_s": round(float(sum(lengths)), 6),  # 0.0, not 0, where there was none
            "longest_stall_s": round(max(lengths, default=0.0), 6),
            "fraction_of_makespan": round(sum(lengths) / makespan_s, 6) if makespan_s > 0 else None,
            "note": (
                "the client's event loop woke at least stall_threshold_s late: for that long it was held (a "
                "blocking call, more work than it could run, or no CPU to spare for the client), and "
                "admission, dispatch and the reading of responses waited for it" + stopped
            ),
            "stops": len(stops),
            "stopped_s": round(float(sum(stops)), 6),
            "stopped_fraction_of_makespan": round(sum(stops) / makespan_s, 6) if makespan_s > 0 else None,
        }


def _inside(spans: list[tuple[float, float]], makespan_s: float) -> list[float]:
    """The lengths of ``spans`` clipped to the measured window, those that overlap it."""
    return [
        min(ended, makespan_s) - max(0.0, began) for began, ended in spans if ended > 0 and began < makespan_s
    ]
