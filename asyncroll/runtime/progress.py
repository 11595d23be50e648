"""The live view of a run: a frozen :class:`RunSnapshot` of every limiter, and the progress line.

Nothing here is called from the hot path. :class:`RunView` only *reads* the limiters' own ``snapshot()``
methods (admission, model gate, CPU dispatcher, worker pool) and the finished-trajectory counts the summary
builder already keeps, whenever a reader asks: the progress line twice a second, the Prometheus exporter
(:mod:`asyncroll.telemetry.exporter`) at scrape time. :func:`render_progress` is a pure function of one
snapshot, so what the line says is tested without a terminal.

The line is drawn on stderr and only when stderr is a terminal: ``asyncroll run … > out.txt`` or a pipe
gets no control characters (``\\r`` redraws, a final newline), and ``--no-progress`` turns it off anywhere.
An explicit ``--progress`` into a file or pipe (a log under nohup or a batch scheduler) writes the same
line whole every :data:`LOG_PERIOD_S` instead, and once more at the end.
It is written by a thread of its own (:class:`Terminal`): a terminal paused with Ctrl-S, or an ssh session
that stopped reading, blocks that thread's write and never the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from asyncroll.clock import Clock
from asyncroll.runtime.admission import Admission
from asyncroll.runtime.daemon_thread import in_daemon_thread
from asyncroll.runtime.dispatcher import CpuDispatcher, DispatcherSnapshot
from asyncroll.runtime.limiter import LimiterSnapshot
from asyncroll.runtime.loop_watch import LoopWatch
from asyncroll.runtime.model_gate import ModelGate, ModelGateSnapshot
from asyncroll.runtime.pool import PoolSnapshot, WorkerPool

#: Redraw period of the progress line, seconds (about twice a second: readable, and costs nothing).
REDRAW_S = 0.5
#: Period of the plain lines an explicit ``--progress`` writes into a file or pipe (a log under nohup or
#: a batch scheduler), seconds: one line each, never redrawn.
LOG_PERIOD_S = 30.0


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Every limiter of a run at one instant, plus finished-trajectory counts by status.

    ``elapsed_s`` is None before the measurement clock started (workers starting, warm-up).
    """

    total: int
    elapsed_s: float | None
    admission: LimiterSnapshot
    model: ModelGateSnapshot
    cpu: DispatcherSnapshot
    pool: PoolSnapshot
    finished: Mapping[str, int]
    loop_stalls: int = 0  # stalls of the event loop so far (a real run's watch), and their seconds
    loop_stalled_s: float = 0.0
    process_stops: int = 0  # stops of the whole process (job control), apart from the stalls
    process_stopped_s: float = 0.0

    @property
    def completed(self) -> int:
        return self.finished.get("completed", 0)

    @property
    def failed(self) -> int:
        return self.finished.get("failed", 0)

    @property
    def done(self) -> int:
        """Trajectories that ended, whatever their status (completed, failed, max_turns, …)."""
        return sum(self.finished.values())


class RunView:
    """Reads a consistent :class:`RunSnapshot` of a running run; holds references, changes nothing."""

    def __init__(
        self,
        *,
        total: int,
        clock: Clock,
        admission: Admission,
        gate: ModelGate,
        dispatcher: CpuDispatcher,
        pool: WorkerPool,
        finished: Mapping[str, int],
        origin: Callable[[], float | None],
        ended: Callable[[], float | None] = lambda: None,
        loop: LoopWatch | None = None,
    ) -> None:
        """``finished``: the status counter the summary builder keeps (read, never written);
        ``origin``/``ended``: the clock readings at measurement start and end, or None before them (the
        elapsed time stops at the end, so the final line shows the makespan, not cleanup too)."""
        self.total = total
        self._clock = clock
        self._admission = admission
        self._gate = gate
        self._dispatcher = dispatcher
        self._pool = pool
        self._finished = finished
        self._origin = origin
        self._ended = ended
        self._loop = loop

    def snapshot(self) -> RunSnapshot:
        origin, ended = self._origin(), self._ended()
        now = self._clock.now() if ended is None else ended
        return RunSnapshot(
            total=self.total,
            elapsed_s=None if origin is None else max(0.0, now - origin),
            admission=self._admission.snapshot(),
            model=self._gate.snapshot(),
            cpu=self._dispatcher.snapshot(),
            pool=self._pool.snapshot(),
            # a copy: callers (the exporter) take snapshots on the event loop's thread, never beside it
            finished={k: int(self._finished.get(k, 0)) for k in tuple(self._finished)},
            loop_stalls=0 if self._loop is None else self._loop.stalls,
            loop_stalled_s=0.0 if self._loop is None else self._loop.stalled_s,
            process_stops=0 if self._loop is None else self._loop.stops,
            process_stopped_s=0.0 if self._loop is None else self._loop.stopped_s,
        )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _rate(per_s: float) -> str:
    """Ended trajectories per second, or per hour below 0.1/s: a run of minutes-long trajectories ends a
    few an hour, which two decimals per second wrote as "0.00/s" (0.0025/s), read as a stalled run."""
    if per_s == 0 or per_s >= 0.1:
        return f"{per_s:.2f}/s"
    per_h = per_s * 3600
    return f"{per_h:.1f}/h" if per_h >= 1 else f"{per_h:.2g}/h"  # one a day: 0.042/h, not 0.0/h


def render_progress(snap: RunSnapshot, width: int = 120) -> str:
    """The progress line for one snapshot: ASCII, at most ``width`` characters, no control characters.

    ``done/total`` counts every ended trajectory, then how they ended (completed, failed and, when any,
    max_turns); the rate is ended trajectories per second of measured time (per hour below 0.1/s) and the
    ETA extrapolates it (unknown until one has ended). Queue depths: model requests waiting for a slot,
    CPU jobs waiting for a worker, and busy workers of the pool.
    """
    done, total = snap.done, snap.total
    pct = f" {100 * done / total:3.0f}%" if total else ""
    parts = [f"{done}/{total}{pct}"]
    if snap.elapsed_s is None:
        parts.append("starting (workers, warm-up)")
    else:
        rate = done / snap.elapsed_s if snap.elapsed_s > 0 else 0.0
        parts.append(_rate(rate))
        if done >= total and total:
            parts.append(f"done in {_duration(snap.elapsed_s)}")
        elif rate > 0:
            parts.append(f"ETA {_duration((total - done) / rate)}")
        else:
            parts.append("ETA unknown")
    parts.append(f"completed {snap.completed}")  # done also counts failed and max_turns: say which
    parts.append(f"failed {snap.failed}")
    max_turns = snap.finished.get("max_turns", 0)
    if max_turns:
        parts.append(f"max_turns {max_turns}")
    parts.append(f"active {snap.admission.holding}/{snap.admission.limit}")
    parts.append(f"model {snap.model.inflight}/{snap.model.limit} +{snap.model.queued} queued")
    parts.append(f"cpu queue {snap.cpu.queued}")
    parts.append(f"workers busy {snap.pool.busy}/{snap.pool.size}")
    if snap.pool.restarts:
        parts.append(f"restarts {snap.pool.restarts}")
    if snap.loop_stalls:
        parts.append(f"loop stalled {snap.loop_stalled_s:.1f}s")
    if snap.process_stops:  # a stop by job control is no stall: said apart, as the summary does
        parts.append(f"stopped {snap.process_stopped_s:.1f}s")
    return _cut(" | ".join(parts), width)


def line_width(stream: TextIO) -> int:
    """One less than the terminal's columns (a full-width line would wrap): ``COLUMNS`` when it is set to
    a positive number (as ``shutil.get_terminal_size`` and ``ls`` read it), else the terminal's size; 120
    when unknown."""
    columns = 0
    with contextlib.suppress(ValueError):
        columns = max(0, int(os.environ.get("COLUMNS", "")))
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        columns = columns or os.get_terminal_size(stream.fileno()).columns
    return max(20, columns - 1) if columns > 0 else 120


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(1, width - 3)] + "..."  # ASCII: any terminal


def redraw(line: str, drawn: int, width: int) -> str:
    """``\\r``, then ``line`` cut to ``width``, then blanks over the rest of the line drawn before (``drawn``
    characters long) but never past ``width``: a terminal narrowed since that line was drawn would wrap a
    wider redraw, and each later ``\\r`` would return to its last row only, leaving rows behind."""
    line = _cut(line, width)
    return "\r" + line + " " * max(0, min(drawn, width) - len(line))


def in_foreground(stream: TextIO) -> bool:
    """Whether this process's group is the foreground job of the terminal ``stream`` is (True where that
    cannot be told: no terminal, not the controlling one, a closed stream). A job in the background
    (``asyncroll run … &`` in an interactive shell) leaves the terminal to the shell: a line drawn there
    lands on its prompt, and under ``stty tostop`` the write stops the whole process (SIGTTOU) until
    ``fg``. Asked before each line, as git does, so that a job brought back with ``fg`` draws again."""
    try:
        return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
    except (AttributeError, OSError, ValueError):
        return True


def progress_enabled(setting: bool | None, stream: TextIO) -> bool:
    """On when asked or by default, and only if ``stream`` is a terminal (never into a pipe or a file)."""
    if setting is False:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # a closed or exotic stream: no line
        return False


def progress_lines(setting: bool | None, stream: TextIO) -> bool:
    """An explicit ``--progress`` (``True``) into a stream that is no terminal: plain lines, one every
    :data:`LOG_PERIOD_S` (the default, ``None``, draws nothing there). None under ``2>&-`` (Python's
    ``sys.stderr`` is then None): nothing to write to."""
    return setting is True and stream is not None and not progress_enabled(True, stream)


class Terminal:
    """Draws progress lines on ``stream`` in place: ``\\r``, the line, blanks over the tail of the line drawn
    before it (:func:`redraw`), and a newline after the final one.

    ``background``: the writes happen on a thread of its own, which draws only the latest line handed to it.
    A write to a terminal paused with Ctrl-S (or an ssh session whose client stopped reading) blocks once
    the terminal's buffer is full; on the event loop that stopped the whole run (no dispatch, no admission)
    until the terminal was resumed. Now only this thread waits, and lines handed meanwhile replace each
    other. The tail to blank is the last line *written*, not the last handed over (one replaced before it
    was written was never on the screen). A stream that fails (closed terminal) ends the drawing, never
    the run. Not ``in_place`` (a file or pipe): each line is written whole on a line of its own.
    """

    def __init__(self, stream: TextIO, *, background: bool = True, in_place: bool = True) -> None:
        self._stream = stream
        self._in_place = in_place
        self._drawn = 0  # length of the last line written, to blank its tail on a shorter redraw
        self._broken = False
        self._ready = threading.Condition()
        self._pending: tuple[str, int, bool] | None = None  # the latest (line, width, final) not yet written
        self._ended = False  # the final line was handed over: later lines are dropped
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._draw_latest, name="asyncroll-progress", daemon=True)
            self._thread.start()

    def show(self, line: str, width: int, *, final: bool = False) -> None:
        """Draw ``line`` (cut to ``width``), ending it with a newline if ``final``; returns at once in the
        background. Nothing is drawn after the final line."""
        if self._thread is None:
            if not self._ended:
                self._ended = final
                self._write(line, width, final)
            return
        with self._ready:
            if self._ended:
                return
            self._ended = final
            self._pending = (line, width, final)
            self._ready.notify()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the final line is written (or the stream failed); False if ``timeout`` passed first.
        Call after a ``final`` line was shown (without one, nothing is waited for: the thread would wait
        for lines forever)."""
        if self._thread is None or not self._ended:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _draw_latest(self) -> None:
        final = False
        while not final:
            with self._ready:
                while self._pending is None:
                    self._ready.wait()
                (line, width, final), self._pending = self._pending, None
            self._write(line, width, final)

    def _write(self, line: str, width: int, final: bool) -> None:
        if self._broken or (self._in_place and not in_foreground(self._stream)):  # a background job
            return  # leaves its terminal alone
        text = redraw(line, self._drawn, width) if self._in_place else line
        try:
            self._stream.write(text + "\n" if final or not self._in_place else text)
            self._stream.flush()
        except (OSError, ValueError):  # a closed terminal: no more lines, the run goes on
            self._broken = True
            return
        self._drawn = 0 if final else len(_cut(line, width))


class ProgressLine:
    """Redraws :func:`render_progress` in place with ``\\r`` about twice a second until :meth:`stop` (not
    ``in_place``: writes it whole, a line each ``period``).

    Snapshots are taken and rendered on the event loop; the :class:`Terminal` writes them (in the
    background unless ``background=False``)."""

    def __init__(
        self,
        view: RunView,
        stream: TextIO | None = None,
        period: float = REDRAW_S,
        *,
        background: bool = True,
        in_place: bool = True,
    ) -> None:
        self._view = view
        self._stream = stream or sys.stderr
        self._period = period
        self._stop = asyncio.Event()
        self._in_place = in_place
        self._terminal = Terminal(self._stream, background=background, in_place=in_place)
        self.redraws = 0

    def _width(self) -> int:
        return line_width(self._stream) if self._in_place else 1000  # a log's line is never cut

    def draw(self, *, final: bool = False) -> None:
        """Render the line once and hand it to the terminal, overwriting the previous one."""
        width = self._width()
        self._terminal.show(render_progress(self._view.snapshot(), width), width, final=final)
        self.redraws += 1

    async def run(self) -> None:
        """Redraw until :meth:`stop`."""
        while not self._stop.is_set():
            self.draw()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._period)

    def stop(self) -> None:
        """Stop redrawing; draw the final state and end the line with a newline (see :meth:`wait`)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.draw(final=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the final line is on the stream (:meth:`Terminal.wait`)."""
        return self._terminal.wait(timeout)

    def join(self) -> None:
        """:meth:`wait` with no timeout."""
        self._terminal.wait()


class LiveView:
    """The progress line and the ``--metrics-port`` exporter of one real-time run, started and stopped
    together. A virtual-clock run (simulation) has none: a redraw timer would be part of its schedule."""

    def __init__(
        self,
        view: RunView,
        *,
        progress: bool | None,
        metrics_port: int | None,
        metrics_host: str = "127.0.0.1",
        info: dict[str, str] | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self._view = view
        self._stream = stream or sys.stderr
        self._line: ProgressLine | None = None
        if progress_enabled(progress, self._stream):
            self._line = ProgressLine(view, self._stream)
        elif progress_lines(progress, self._stream):
            self._line = ProgressLine(view, self._stream, LOG_PERIOD_S, in_place=False)
        self._metrics = (metrics_port, metrics_host, info)
        self._exporter: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def progress(self) -> ProgressLine | None:
        return self._line

    def start(self, tg: asyncio.TaskGroup) -> dict[str, Any] | None:
        """Listen on the metrics port (if asked; raises a clear error when it cannot) and start the line.
        Returns the ``metrics`` section for ``run.json``, or None without ``--metrics-port``."""
        described = None
        port, host, info = self._metrics
        if port is not None:
            from asyncroll.telemetry.exporter import MetricsExporter, RuntimeCollector

            collector = RuntimeCollector(self._view, asyncio.get_running_loop(), info)
            self._exporter = MetricsExporter(collector, port, host).start()
            described = self._exporter.describe()
            if self._stream is not None:  # None under 2>&-: the address is not said
                with contextlib.suppress(OSError, ValueError):
                    self._stream.write(f"metrics: {self._exporter.url}\n")
                    self._stream.flush()
        if self._line is not None:
            self._task = tg.create_task(self._line.run())
        return described

    async def aclose(self) -> None:
        """Hand the final progress line to its thread (:meth:`drained` waits until it is on the terminal),
        then release the metrics port (off the loop: a scrape in flight may be waiting for the loop to take
        its snapshot)."""
        if self._line is not None:
            self._line.stop()
        if self._task is not None and not self._task.done():  # done: cancelled with its task group
            await self._task
        if self._exporter is not None:
            await asyncio.to_thread(self._exporter.stop)

    async def drained(self, at_most_s: float | None = None) -> None:
        """Wait until the final progress line is on the terminal (after :meth:`aclose`), or ``at_most_s``
        passed: before anything else is written to it. A run waits for it without a timeout after its
        outputs are written, so that a terminal paused with Ctrl-S holds this wait only, never the
        summary, run.json or the closing of the workers. In a daemon thread: the loop stays free (signals)
        meanwhile."""
        line = self._line
        if line is not None:

            def final_line() -> None:
                line.wait(at_most_s)

            await in_daemon_thread(final_line)
