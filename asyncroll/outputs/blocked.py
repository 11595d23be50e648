"""Client CPU-blocked time: how long the client had work only for the CPU and none for the model.

Blocked means, at the same instant: at least one active trajectory, zero model requests outstanding
(queued or in flight) and at least one CPU job pending (queued or running). During such an interval the
inference server gets nothing from this client: it is the client-side half of "model starvation"
(MEASUREMENT.md). Integrated exactly over the event stream's own timestamps. An interval is a span of
positive length: the state can hold for an instant only (events at one timestamp, e.g. a simulated grade
job of 0 s), which adds no time and is not counted as an interval; nor does a state that leaves it
for an instant only split an interval in two (a simulated model turn of 0 s between two jobs). A request
a stop cancelled stays outstanding: the stop itself is not blocked time.
"""

from __future__ import annotations

from asyncroll.events import (
    CpuEnqueued,
    CpuFailed,
    CpuFinished,
    Event,
    ModelEnqueued,
    ModelFailed,
    ModelFinished,
    TrajectoryFinished,
    TrajectoryStarted,
)

_DELTAS: dict[type[Event], tuple[int, int, int]] = {
    # (active trajectories, model outstanding, CPU jobs pending)
    TrajectoryStarted: (1, 0, 0),
    TrajectoryFinished: (-1, 0, 0),
    ModelEnqueued: (0, 1, 0),
    ModelFinished: (0, -1, 0),
    ModelFailed: (0, -1, 0),
    CpuEnqueued: (0, 0, 1),
    CpuFinished: (0, 0, -1),
    CpuFailed: (0, 0, -1),
}


class BlockedMeter:
    def __init__(self) -> None:
        self.active = 0
        self.outstanding = 0
        self.pending = 0
        self.blocked_s = 0.0
        self._closed = 0  # intervals of positive length that have ended
        self._since: float | None = None
        self._start = 0.0  # when the interval under way began (before any instant it was left for)
        self._left: tuple[float, float] | None = None  # (end, start) of the last interval counted

    def __call__(self, event: Event) -> None:
        delta = _DELTAS.get(type(event))
        if delta is None:
            return
        if delta[1] and type(event) is ModelFailed and event.kind == "cancelled":
            # A stop cancelled it, not an answer: the client did not turn to wait on its CPU (the stop
            # cancels requests at once and a running job only once its worker is killed).
            return
        # blocked (≥ 1 active, 0 outstanding, ≥ 1 pending) before and after, inline: this runs for most
        # events of a run
        was = self.active > 0 and self.outstanding == 0 and self.pending > 0
        self.active += delta[0]
        self.outstanding += delta[1]
        self.pending += delta[2]
        now = self.active > 0 and self.outstanding == 0 and self.pending > 0
        if now and not was:
            self._since, self._start = event.t, event.t
            if self._left is not None and self._left[0] == event.t:  # left and entered again at once
                self._closed -= 1  # the same interval goes on
                self._start = self._left[1]
            self._left = None
        elif was and not now and self._since is not None:
            self.blocked_s += event.t - self._since
            if event.t > self._start:
                self._closed += 1
                self._left = (event.t, self._start)
            self._since = None

    def intervals(self, end: float) -> int:
        """Blocked intervals of positive length up to ``end`` (one still open counts if it began before)."""
        return self._closed + (self._since is not None and end > self._start)

    def total(self, end: float) -> float:
        """Blocked seconds up to ``end`` (an interval still open is closed there).

        ``end`` must not lie before an interval that has already closed: closed intervals are summed, not
        kept, so one that ended after ``end`` would count whole. The summary asks at the makespan, and
        ``ResourceMeter._fold`` at a window edge clipped to [0, makespan] (only for a sample outside that
        span): no sample lies before 0 (sampling starts with the measurement), and no event changes the
        state after the makespan (a complete run has no trajectory left; a stopped run's cancellations are
        emitted by its cancelled trajectories, before its window closes)."""
        open_s = end - self._since if self._since is not None else 0.0
        return round(self.blocked_s + max(0.0, open_s), 6)
