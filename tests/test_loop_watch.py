"""Stalls of the client's event loop: :class:`LoopWatch` on a real loop held by a blocking call (its
events, and the counts the live view reads), the
``event_loop`` summary section built from ``loop_stalled`` events (clipped to the measured window; null when
the loop was not watched), and a real run whose client was stopped (SIGSTOP: no CPU for it) for 0.6 s, which
its events, summary, trace and timeline all say: as a stop of the process (job control, ``process_stopped``),
counted apart from the loop's stalls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from asyncroll.clock import SystemClock
from asyncroll.commands.run_warnings import warn_loop_stalls
from asyncroll.event_log import EventLog
from asyncroll.events import Event, LoopStalled, LoopWatched, MeasurementStarted, ProcessStopped
from asyncroll.outputs.pauses import LoopStallMeter
from asyncroll.runtime.loop_watch import LoopWatch
from tests.children import end
from tests.cli_runs import _wait_for, load_run
from tests.conftest import REPO, tool_problem, write_workload
from tests.test_live_view import _scrape


def _watching(clock: SystemClock) -> tuple[EventLog, list[Event], LoopWatch]:
    """An event log on ``clock`` with its window open, the events it records, and a watch writing to it."""
    log = EventLog(clock)
    seen: list[Event] = []
    log.subscribe(seen.append)
    log.start_measurement()
    return log, seen, LoopWatch(clock, log)


@pytest.mark.timeout(20)
def test_a_blocking_call_on_the_loop_is_a_stall_as_long_as_it() -> None:
    clock = SystemClock()
    _, seen, loop_watch = _watching(clock)

    async def main() -> None:
        watch = asyncio.create_task(loop_watch.run())
        await asyncio.sleep(0.12)  # the watch is asleep now
        time.sleep(0.5)  # noqa: ASYNC251 - the blocking call under test
        await asyncio.sleep(0.12)  # the watch woke and recorded it
        watch.cancel()

    asyncio.run(main())
    stalls = [e for e in seen if isinstance(e, LoopStalled)]
    # woke 0.45-0.5 s late (it had up to one probe period of its sleep left); a loaded machine adds, never
    # takes away, so only the lower end is certain
    assert any(e.late_s >= 0.44 for e in stalls), stalls
    # each event's late_s is rounded to the microsecond, the watch's total is not
    total = sum(e.late_s for e in stalls)
    assert loop_watch.stalls == len(stalls) and loop_watch.stalled_s == pytest.approx(total, abs=1e-5)


@pytest.mark.timeout(20)
def test_a_loop_held_before_the_watch_first_runs_is_a_stall_too() -> None:
    """The run creates the telemetry's task (its sample at t = 0) before the watch's: a blocking first
    sample held the loop before the watch ever slept, and the watch, timing its first sleep from its own
    start, saw nothing. Its first wake-up is due ``probe_s`` after it was announced."""
    clock = SystemClock()
    log, seen, loop_watch = _watching(clock)

    async def blocking_first_sample() -> None:
        time.sleep(0.5)  # noqa: ASYNC251 - the blocking call under test

    async def main() -> None:
        first = asyncio.create_task(blocking_first_sample())  # created first: it runs first
        log.emit(loop_watch.announce())
        watch = asyncio.create_task(loop_watch.run())
        await first
        await asyncio.sleep(0.12)
        watch.cancel()

    asyncio.run(main())
    stalls = [e.late_s for e in seen if isinstance(e, LoopStalled)]
    assert any(late >= 0.4 for late in stalls), stalls


@pytest.mark.timeout(20)
def test_a_late_wake_up_that_spans_a_sigcont_is_a_stop_not_a_stall() -> None:
    """A process stopped (Ctrl-Z, SIGSTOP) and continued wakes as late as it was stopped: the watch's
    SIGCONT handler tells that from a stall. Here a blocking call stands in for the stop and the process
    sends itself the SIGCONT meanwhile; the handler before is put back afterwards."""
    clock = SystemClock()
    _, seen, loop_watch = _watching(clock)
    before = signal.getsignal(signal.SIGCONT)

    async def main() -> None:
        with loop_watch.continued_handled():
            watch = asyncio.create_task(loop_watch.run())
            await asyncio.sleep(0.12)
            os.kill(os.getpid(), signal.SIGCONT)
            time.sleep(0.5)  # noqa: ASYNC251 - the "stop"
            await asyncio.sleep(0.12)
            time.sleep(0.5)  # noqa: ASYNC251 - a blocking call after it: a stall again
            await asyncio.sleep(0.12)
            watch.cancel()

    asyncio.run(main())
    assert signal.getsignal(signal.SIGCONT) == before
    stops = [e.stopped_s for e in seen if isinstance(e, ProcessStopped)]
    stalls = [e.late_s for e in seen if isinstance(e, LoopStalled)]
    assert len(stops) == 1 and stops[0] >= 0.44, seen
    assert any(late >= 0.44 for late in stalls), seen
    assert loop_watch.stops == 1 and loop_watch.stopped_s == pytest.approx(stops[0], abs=1e-5)
    assert loop_watch.stalls == len(stalls)


@pytest.mark.timeout(20)
def test_a_stop_before_the_watch_first_runs_is_a_stop_too() -> None:
    """The process stopped (and continued) after the handler went in but before the watch's task first
    ran (the telemetry's first sample, the admission's first steps run before it): the watch took the
    continuations counted by then for old ones, and the late first wake-up for a stall."""
    clock = SystemClock()
    log, seen, loop_watch = _watching(clock)

    async def stopped_first() -> None:
        os.kill(os.getpid(), signal.SIGCONT)
        time.sleep(0.5)  # noqa: ASYNC251 - the "stop"

    async def main() -> None:
        first = asyncio.create_task(stopped_first())  # created first: it runs first
        log.emit(loop_watch.announce())
        with loop_watch.continued_handled():
            watch = asyncio.create_task(loop_watch.run())
            await first
            await asyncio.sleep(0.12)
            watch.cancel()

    asyncio.run(main())
    stops = [e.stopped_s for e in seen if isinstance(e, ProcessStopped)]
    assert len(stops) == 1 and stops[0] >= 0.4, seen
    assert not [e for e in seen if isinstance(e, LoopStalled)], seen


class _JumpingClock(SystemClock):
    """Real monotonic time plus an offset a test moves on: a jump of the offset reads to the watch as a
    wake-up that late, without the test waiting for it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.monotonic() + self.offset


@pytest.mark.timeout(20)
def test_the_watch_totals_every_stall_and_every_stop() -> None:
    """``stalls``/``stalled_s`` and ``stops``/``stopped_s`` (the live view's counters) add up every late
    wake-up, not the last one only: two stalls of 5 and 7 s and two stops of 3 and 4 s."""
    clock = _JumpingClock()
    _, seen, loop_watch = _watching(clock)

    async def main() -> None:
        with loop_watch.continued_handled():
            watch = asyncio.create_task(loop_watch.run())
            for jump, stop in ((5.0, False), (3.0, True), (7.0, False), (4.0, True)):
                await asyncio.sleep(0.01)  # the watch is asleep now
                if stop:
                    os.kill(os.getpid(), signal.SIGCONT)
                clock.offset += jump
                await asyncio.sleep(0.12)  # the watch woke and recorded it
            watch.cancel()

    asyncio.run(main())
    stops = [e.stopped_s for e in seen if isinstance(e, ProcessStopped)]
    stalls = [e.late_s for e in seen if isinstance(e, LoopStalled)]
    assert [round(s) for s in stops] == [3, 4], seen
    assert [round(s) for s in stalls if s >= 1] == [5, 7], seen  # a loaded machine may add short ones
    assert loop_watch.stops == 2 and loop_watch.stopped_s == pytest.approx(sum(stops), abs=1e-5)
    assert loop_watch.stalls == len(stalls) and loop_watch.stalled_s == pytest.approx(sum(stalls), abs=1e-5)


class _StoppedAtCall(_JumpingClock):
    """A clock under which the process is "stopped" for 3 s (and continued: SIGCONT) during its
    ``at``-th reading."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def now(self) -> float:
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGCONT)
            self.offset += 3.0
            _handlers_run()  # a Python call: the signal's handler runs here, as on a real continuation
        return super().now()


def _handlers_run() -> None:
    pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("at", [3, 4, 5, 6])
def test_a_stop_is_counted_whichever_reading_of_the_clock_it_falls_in(at: int) -> None:
    """The watch read the clock twice per wake-up, once for its lateness and once for its next due time:
    a stop between the two readings was in neither wake-up's lateness (lost), and its continuation then
    marked the next late wake-up a stop. One reading now serves both, so every stop is counted once."""
    clock = _StoppedAtCall(at)
    _, seen, loop_watch = _watching(clock)

    async def main() -> None:
        with loop_watch.continued_handled():
            watch = asyncio.create_task(loop_watch.run())
            while clock.calls < at + 4:  # noqa: ASYNC110 - the watch reads the clock as it wakes
                await asyncio.sleep(0.01)
            watch.cancel()

    asyncio.run(main())
    stops = [e.stopped_s for e in seen if isinstance(e, ProcessStopped)]
    assert [round(s) for s in stops] == [3], seen
    assert not [e for e in seen if isinstance(e, LoopStalled) and e.late_s >= 1], seen


@pytest.mark.timeout(20)
def test_a_sigcont_taken_by_another_thread_still_marks_its_wake_up_a_stop() -> None:
    """The kernel gives a continued process's SIGCONT to the first of its threads to dequeue it; taken by
    another thread, the handler runs in the main thread only after that thread ran, which may be after the
    watch read its late wake-up. The watch waits a grace for it before calling the wake-up a stall: here the
    SIGCONT reaches the main thread only during that grace (after the reading), and the wake-up is a stop.
    A late wake-up with no SIGCONT at all waits the whole grace and is a stall; no grace without the
    handler."""
    clock = _JumpingClock()
    _, seen, loop_watch = _watching(clock)
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:  # the first late wake-up's SIGCONT comes late; the second has none
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGCONT)
            _handlers_run()  # a Python call: the handler runs here

    loop_watch.pause = pause

    async def main() -> None:
        with loop_watch.continued_handled():
            watch = asyncio.create_task(loop_watch.run())
            for jump in (3.0, 5.0):
                await asyncio.sleep(0.01)  # the watch is asleep now
                clock.offset += jump
                await asyncio.sleep(0.12)  # the watch woke and recorded it
        late_unhandled = len(pauses)
        await asyncio.sleep(0.01)
        clock.offset += 7.0  # no handler in place now: no grace
        await asyncio.sleep(0.12)
        watch.cancel()
        assert len(pauses) == late_unhandled, pauses

    asyncio.run(main())
    stops = [e.stopped_s for e in seen if isinstance(e, ProcessStopped)]
    stalls = [round(e.late_s) for e in seen if isinstance(e, LoopStalled) and e.late_s >= 1]
    assert [round(s) for s in stops] == [3], seen
    assert stalls == [5, 7], seen
    # the stop's grace ended with its SIGCONT; the stall's waited all of it, in tenths
    assert pauses == [0.001] + [0.001] * 10, pauses


def _watched(meter: LoopStallMeter, stall_s: float | None) -> None:
    """The window opens (measurement_started) and, unless ``stall_s`` is None (a simulation, an older
    run), the loop is watched (loop_watched)."""
    started = MeasurementStarted(
        wall_time=0.0, policy="fifo", max_active_trajectories=1, max_inflight_model_requests=1, cpu_workers=1
    )
    meter.on_started(started)
    if stall_s is not None:
        meter.on_watched(LoopWatched(probe_s=0.05, stall_s=stall_s))


def test_the_summary_counts_stalls_inside_the_window_only() -> None:
    meter = LoopStallMeter()
    _watched(meter, 0.1)
    for t, late in ((0.05, 0.2), (1.0, 0.3), (2.0, 0.25), (9.0, 0.5)):  # began before t=0; ; ; after the end
        meter.on_stalled(LoopStalled(t=t, late_s=late))
    section = meter.build(makespan_s=2.1)
    assert section["watched"] and section["stall_threshold_s"] == 0.1
    assert section["stalls"] == 3 and section["stalled_s"] == pytest.approx(0.05 + 0.3 + 0.25)
    assert section["longest_stall_s"] == pytest.approx(0.3)
    assert section["fraction_of_makespan"] == pytest.approx(0.6 / 2.1, abs=1e-6)
    calm = LoopStallMeter()
    _watched(calm, 0.1)
    assert calm.build(3.0) | {"note": None} == {
        "watched": True,
        "stall_threshold_s": 0.1,
        "stalls": 0,
        "stalled_s": 0.0,
        "longest_stall_s": 0.0,
        "fraction_of_makespan": 0.0,
        "note": None,
        "stops": 0,
        "stopped_s": 0.0,
        "stopped_fraction_of_makespan": 0.0,
    }
    # seconds are a float in summary.json even where there were none (0 == 0.0: the dict compares equal)
    assert type(calm.build(3.0)["stalled_s"]) is float and type(calm.build(3.0)["longest_stall_s"]) is float


def test_the_summary_counts_stops_apart_from_stalls() -> None:
    meter = LoopStallMeter()
    _watched(meter, 0.1)
    meter.on_stalled(LoopStalled(t=1.0, late_s=0.3))
    for t, stopped in ((3.0, 1.5), (9.0, 2.0)):  # the second continued after the end: clipped to it
        meter.on_stopped(ProcessStopped(t=t, stopped_s=stopped))
    section = meter.build(makespan_s=8.0)
    assert section["stalls"] == 1 and section["stalled_s"] == pytest.approx(0.3)
    assert section["stops"] == 2 and section["stopped_s"] == pytest.approx(1.5 + 1.0)
    assert section["stopped_fraction_of_makespan"] == pytest.approx(2.5 / 8.0)
    assert section["fraction_of_makespan"] == pytest.approx(0.3 / 8.0)
    assert "the process was stopped (job control" in section["note"]
    # a stop wholly after the window is not counted; without a stop the note says none
    meter.on_stopped(ProcessStopped(t=12.0, stopped_s=1.0))
    assert meter.build(makespan_s=8.0)["stops"] == 2
    calm = LoopStallMeter()
    _watched(calm, 0.1)
    calm.on_stopped(ProcessStopped(t=12.0, stopped_s=1.0))
    section = calm.build(makespan_s=8.0)
    assert section["stops"] == 0 and section["stopped_s"] == 0.0 and "stopped" not in section["note"]


def test_a_window_of_no_length_has_no_fractions() -> None:
    """A makespan of 0 (a window that closed as it opened) has counts but no fraction: no division by
    zero."""
    meter = LoopStallMeter()
    _watched(meter, 0.1)
    section = meter.build(makespan_s=0.0)
    assert section["stalls"] == 0 and section["stops"] == 0
    assert section["fraction_of_makespan"] is None and section["stopped_fraction_of_makespan"] is None


@pytest.mark.parametrize("threshold", [None, 0.1])
def test_an_unwatched_loop_or_an_unopened_window_has_no_figures(threshold: float | None) -> None:
    """A simulation (or an events.jsonl from before the watch) is not watched: its figures are unknown,
    never 0; nor are they known for a watched run whose measured window never opened."""
    meter = LoopStallMeter()
    _watched(meter, threshold)
    section = meter.build(5.0 if threshold is None else None)
    assert section["watched"] is (threshold is not None)
    assert [section[k] for k in ("stalls", "stalled_s", "longest_stall_s", "fraction_of_makespan")] == [
        None
    ] * 4
    assert "not watched" in section["note"] if threshold is None else "never opened" in section["note"]


def test_a_run_that_ended_before_its_window_opened_says_so() -> None:
    """A real run that failed before measurement_started (a worker that could not spawn) has no
    measurement_started to read: its note says the window never opened, not that it was a simulation or
    an older run, which it was not."""
    section = LoopStallMeter().build(None)
    assert section["watched"] is False and section["stalls"] is None
    assert "never opened" in section["note"] and "simulation" not in section["note"]


def _stalled_run(tmp_path: Path, trajectories: int, *flags: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``asyncroll run`` of ``trajectories`` problems (3 turns of 50 ms model time and 150 ms jobs, one
    worker), stopped (SIGSTOP, as Ctrl-Z's SIGTSTP does) for 0.6 s once its first job started, then
    continued (SIGCONT, as ``fg``): its workers go on, its loop does not. The process, resumed, and its
    output folder."""
    problems = [tool_problem(f"p{i}", model_ms=50, cpu_ms=150, turns=3) for i in range(trajectories)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "asyncroll.cli",
        "run",
        "--workload",
        str(workload),
        "--output",
        str(out),
    ]
    proc = subprocess.Popen(
        [*command, "--cpu-workers", "1", "--no-progress", *flags], cwd=REPO, stderr=subprocess.PIPE
    )
    try:
        _wait_for(out / "events.jsonl", '"event":"cpu_started"', writer=proc)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.6)
        os.kill(proc.pid, signal.SIGCONT)
    except BaseException:
        end(proc)
        raise
    return proc, out


@pytest.mark.timeout(150)
def test_a_run_stopped_by_job_control_says_so_apart_from_stalls(tmp_path: Path) -> None:
    """A run stopped for 0.6 s (kill -STOP … kill -CONT, as Ctrl-Z … fg) completes, and its events,
    summary, trace.json and timeline.html record a stop of at least 0.5 s, stderr warns of it and the live
    counters count it: as a stop of the process, not a stall of its event loop (it was "a blocking call in
    the client, more work than the loop could run, or no CPU", none of which it was)."""
    proc, out = _stalled_run(tmp_path, 4, "--metrics-port", "0")
    scraped: dict[str, float] = {}
    try:
        port = json.loads((out / "run.json").read_text())["metrics"]["port"]
        with contextlib.suppress(OSError):  # the run ended first: the summary below still says it
            while proc.poll() is None and not scraped.get("asyncroll_process_stops_total"):
                scraped = _scrape(f"http://127.0.0.1:{port}/metrics")
                time.sleep(0.05)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 0, stderr
    assert b"warning: the process was stopped (job control: Ctrl-Z, SIGSTOP) 1 time(s)" in stderr, stderr
    assert b"summary.json: event_loop" in stderr
    _receipt, summary, events = load_run(out)
    started = next(e for e in events if isinstance(e, MeasurementStarted))
    [watched] = [e for e in events if isinstance(e, LoopWatched)]
    assert started.clock == "monotonic" and (watched.t, watched.probe_s, watched.stall_s) == (0.0, 0.05, 0.1)
    [stop] = [e for e in events if isinstance(e, ProcessStopped)]
    assert stop.stopped_s >= 0.5
    # the wake-up that spanned the stop is no stall: no stall overlaps it
    stalls = [e for e in events if isinstance(e, LoopStalled)]
    assert not [e for e in stalls if e.t > stop.t - stop.stopped_s and e.t - e.late_s < stop.t], stalls
    loop = summary["event_loop"]
    assert loop["watched"] and loop["stops"] == 1 and loop["stopped_s"] >= 0.5
    assert 0 < loop["stopped_fraction_of_makespan"] < 1
    assert loop["stalled_s"] == pytest.approx(sum(e.late_s for e in stalls), abs=1e-5)
    assert "the process was stopped (job control" in loop["note"]
    assert summary["makespan_s"] >= loop["stopped_s"]  # the makespan is the wall time: the stop inside it
    trace = json.loads((out / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e.get("name") == "process stopped (job control)"]
    assert slices and max(e["dur"] for e in slices) >= 500_000  # µs
    assert "process stopped (job control)" in (out / "timeline.html").read_text()
    if scraped:  # the live view's counters (--metrics-port), scraped before the run ended
        assert scraped["asyncroll_process_stops_total"] >= 1, scraped
        assert scraped["asyncroll_process_stopped_seconds_total"] >= 0.5, scraped


def test_stalls_are_warned_about_from_a_twentieth_of_the_makespan_and_half_a_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def loop(fraction: float | None) -> dict[str, object]:
        stalled = None if fraction is None else 10 * fraction
        return {
            "event_loop": {
                "stalls": 2,
                "stalled_s": stalled,
                "longest_stall_s": 0.3,
                "fraction_of_makespan": fraction,
            }
        }

    short = {
        "event_loop": {"stalls": 1, "stalled_s": 0.2, "longest_stall_s": 0.2, "fraction_of_makespan": 0.2}
    }
    for quiet in (None, {}, {"event_loop": None}, loop(None), loop(0.049), short):
        warn_loop_stalls(quiet)  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    warn_loop_stalls(loop(0.05))
    assert (
        "stalled 2 time(s), 0.500 s in all (5% of the makespan; longest 0.300 s)" in capsys.readouterr().err
    )


@pytest.mark.timeout(150)
def test_an_interrupted_run_that_was_stopped_is_warned_about_too(tmp_path: Path) -> None:
    """An interrupted run writes summary.json too, and `run` says what it tells (telemetry, a server that
    was down): a stop of the process, which may be why the run seemed stuck and was interrupted, is said
    too."""
    proc, out = _stalled_run(tmp_path, 60)
    try:
        _wait_for(out / "events.jsonl", '"event":"process_stopped"', writer=proc)
        os.kill(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["event_loop"]["stopped_s"] >= 0.5, summary["event_loop"]
    assert b"warning: the process was stopped (job control" in stderr, stderr
