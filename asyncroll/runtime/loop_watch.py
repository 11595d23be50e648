"""Watches a real run's event loop for stalls: :class:`LoopWatch` emits ``loop_stalled`` events.

Everything a run does goes through one event loop; a blocking call on it (a slow write, a long computation,
a paused terminal) or a machine with no CPU to spare for the client stops admission, dispatch and the reading
of responses at once. Queue and latency figures then grow, and without this watch the summary blamed the
schedule for them. The watch (:class:`LoopWatch`) sleeps :data:`PROBE_S` at a time; a wake-up at least
:data:`STALL_S` late is a stall, recorded with how late it was (a stall shorter than the probe period can go
unseen: the figures are a lower bound, with a grain of :data:`PROBE_S`). A simulation's clock is virtual: it
has no watch.

A process stopped by job control (Ctrl-Z, ``kill -STOP``) and continued (``SIGCONT``) wakes late too, as late
as it was stopped; that is no stall of the loop. While the watch runs, a ``SIGCONT`` handler
(:meth:`LoopWatch.continued_handled`) counts each continuation, and a late wake-up that spans one is a
``process_stopped`` event instead, counted apart (:attr:`LoopWatch.stops`, :attr:`LoopWatch.stopped_s`).
The kernel hands a continued process's SIGCONT to whichever of its threads dequeues it first; taken by
another thread (an output writer, the exporter's server, a BLAS pool), its handler runs in the main thread
only once that thread has run, which may be after the watch read its late wake-up. So a late wake-up with
no continuation counted yet waits up to :data:`CONTINUE_GRACE_S` for one before it is called a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType

from asyncroll.cli_signals import put_back
from asyncroll.clock import Clock
from asyncroll.event_log import EventLog
from asyncroll.events import LoopStalled, LoopWatched, ProcessStopped

#: How long the watch sleeps at a time: 20 wake-ups a second, one timer callback each.
PROBE_S = 0.05
#: A wake-up at least this late is a stall (an idle loop wakes late by well under a millisecond).
STALL_S = 0.1
#: How long a late wake-up with no continuation counted waits for a SIGCONT another thread took (its
#: handler is then pending): the loop is held that long, once per stall, never on a wake-up on time.
CONTINUE_GRACE_S = 0.01
_GRACE_STEPS = 10


class LoopWatch:
    """Emits ``loop_stalled`` for each wake-up ``stall_s`` or more late while :meth:`run` runs
    (``process_stopped`` for one that spans a ``SIGCONT``), and keeps the counts the live view reads
    (``--metrics-port``, the progress line)."""

    def __init__(
        self, clock: Clock, events: EventLog, probe_s: float = PROBE_S, stall_s: float = STALL_S
    ) -> None:
        self._clock = clock
        self._events = events
        self.probe_s = probe_s
        self.stall_s = stall_s
        self.stalls = 0
        self.stalled_s = 0.0
        self.stops = 0  # late wake-ups that spanned a stop of the process (SIGSTOP/SIGTSTP ... SIGCONT)
        self.stopped_s = 0.0
        self._continued = 0  # SIGCONTs received while the handler was installed
        self._since: float | None = None  # when the watch was announced: its first wake-up is due then
        self._continued_since = 0  # the SIGCONTs counted by then: a stop after it spans the first wake-up
        self._handled = False  # whether the SIGCONT handler is in place (continued_handled)
        #: how the grace waits (blocking: the pending handler runs as it returns); a test's seam
        self.pause: Callable[[float], None] = time.sleep

    def announce(self) -> LoopWatched:
        """The ``loop_watched`` event: the loop is watched, and how (emitted as the window opens). The
        first wake-up is due ``probe_s`` after this, however late :meth:`run` first runs: the tasks
        created before it (the telemetry's first sample, at t = 0) may hold the loop first."""
        self._since = self._clock.now()
        self._continued_since = self._continued
        return LoopWatched(probe_s=self.probe_s, stall_s=self.stall_s)

    def _on_continued(self, _signum: int, _frame: FrameType | None) -> None:
        self._continued += 1

    @contextlib.contextmanager
    def continued_handled(self) -> Iterator[None]:
        """A ``SIGCONT`` handler in place while the block runs (the handler before is put back after): it
        counts the continuations of the process, which :meth:`run` tells a stop by. A plain
        :func:`signal.signal` handler, not the loop's: it runs as soon as the process runs again, before
        the watch's late wake-up is read (a loop callback may run after it). Main thread only; elsewhere
        (or where there is no SIGCONT) nothing is installed and a stop reads as a stall, as before."""
        sig = getattr(signal, "SIGCONT", None)
        previous = None
        installed = False
        if sig is not None:
            try:
                previous = signal.signal(sig, self._on_continued)
                installed = self._handled = True
                signal.siginterrupt(sig, False)  # another thread's system call is restarted, not failed
            except (ValueError, OSError):  # not the main thread
                pass
        try:
            yield
        finally:
            if installed and sig is not None:
                self._handled = False
                put_back(sig, previous)

    def _continued_within_grace(self, seen: int) -> bool:
        """Whether a SIGCONT is counted within :data:`CONTINUE_GRACE_S` (checked every tenth of it)."""
        for _ in range(_GRACE_STEPS):
            if self._continued != seen:
                return True
            self.pause(CONTINUE_GRACE_S / _GRACE_STEPS)
        return self._continued != seen

    async def run(self) -> None:
        """Sleep ``probe_s`` at a time until cancelled."""
        clock = self._clock
        asked = (clock.now() if self._since is None else self._since) + self.probe_s
        # a continuation before the task first ran (after the announcement) spans its first wake-up too
        seen = self._continued if self._since is None else self._continued_since
        while True:
            await asyncio.sleep(max(0.0, asked - clock.now()))
            now = clock.now()
            late = now - asked
            continued, seen = self._continued != seen, self._continued  # read after the late time
            if late >= self.stall_s:
                if not continued and self._handled:  # its SIGCONT may be another thread's, not yet handled
                    continued = self._continued_within_grace(seen)
                    seen = self._continued
                if continued:  # the process was stopped meanwhile: that, not the loop, made it late
                    self.stops += 1
                    self.stopped_s += late
                    self._events.emit(ProcessStopped(stopped_s=round(late, 6)), at=now)
                else:
                    self.stalls += 1
                    self.stalled_s += late
                    self._events.emit(LoopStalled(late_s=round(late, 6)), at=now)
            # from the reading above, not a new one: a stop (or a stall) between the two readings was in
            # neither wake-up's lateness, and its continuation then marked the next stall a stop
            asked = now + self.probe_s
