"""The progress line at its edges: the first instant of measurement, a line exactly as wide as the terminal,
a shorter redraw over a longer one, a terminal narrowed between two draws, the terminal's width read from a
real pseudo-terminal, a paused terminal (Ctrl-S), a closed or failing stream, and :class:`RunView`'s elapsed
time (stopped at the end, never negative); the sweep's cell line on a narrow terminal and when the sweep
stops early. No run, no sleeps."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import termios
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from asyncroll.commands.sweep_progress import SweepProgress
from asyncroll.runtime.progress import ProgressLine, RunSnapshot, RunView, progress_enabled, render_progress
from tests.cli_runs import SMOKE
from tests.test_live_view import snap


def test_the_first_instant_and_a_fraction_of_a_second_give_a_rate() -> None:
    """At measurement start (elapsed 0) the rate is 0 and the ETA unknown, never a division by zero; half
    a second with one trajectory ended is 2/s, whatever the clock's grain."""
    assert render_progress(snap({}, 0.0), width=200).startswith(
        "0/10   0% | 0.00/s | ETA unknown | completed 0"
    )
    assert render_progress(snap({"completed": 1}, 0.5), width=200).startswith(
        "1/10  10% | 2.00/s | ETA 0:04 |"
    )
    assert "| completed 0 | failed 2 |" in render_progress(snap({"failed": 2}, 1.0), width=200)


def test_a_line_exactly_as_wide_as_allowed_is_not_cut() -> None:
    full = render_progress(snap({"completed": 3}, 8.0), width=500)
    assert render_progress(snap({"completed": 3}, 8.0), width=len(full)) == full
    assert render_progress(snap({"completed": 3}, 8.0), width=len(full) - 1) == full[: len(full) - 4] + "..."


class _Switch:
    def __init__(self, *snaps: RunSnapshot) -> None:
        self._snaps = list(snaps)

    def snapshot(self) -> RunSnapshot:
        return self._snaps.pop(0)


def test_a_shorter_redraw_blanks_exactly_the_old_tail() -> None:
    long, short = snap({"completed": 3}, 8.0, restarts=12), snap({"completed": 3}, 8.0)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 201, 0, 0))  # room for both lines

    class Wide(io.StringIO):  # written here, sized by the pseudo-terminal
        def fileno(self) -> int:
            return follower

    stream = Wide()
    try:
        line = ProgressLine(_Switch(long, short, short), stream, background=False)  # type: ignore[arg-type]
        line.draw()
        line.draw()
        line.draw()
    finally:
        os.close(follower)
        os.close(leader)
    first, second, third = stream.getvalue().split("\r")[1:]
    assert first == render_progress(long, 200) and len(first) > len(render_progress(short, 200))
    assert second == render_progress(short, 200) + " " * (len(first) - len(render_progress(short, 200)))
    assert third == render_progress(short, 200)  # nothing left to blank


class _Counting:
    """A run view whose n-th snapshot has n trajectories completed (of 10)."""

    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self) -> RunSnapshot:
        self.calls += 1
        return snap({"completed": self.calls}, 8.0)


@pytest.mark.timeout(30)
def test_a_paused_terminal_holds_the_drawing_thread_never_the_run() -> None:
    """Ctrl-S pauses a terminal's output (``tcflow(TCOOFF)`` on a real pseudo-terminal): once its buffer is
    full (a pseudo-terminal's at once), a write waits for Ctrl-Q. 3,000 redraws are handed over at once, as
    the event loop would; after the resume the final line is the last one on the screen, once."""
    leader, follower = pty.openpty()
    _columns(follower, 201)
    termios.tcflow(follower, termios.TCOOFF)  # a stopped pseudo-terminal takes no byte: a write waits at once
    stream = io.TextIOWrapper(io.FileIO(follower, "w", closefd=False), write_through=True)
    view = _Counting()
    try:
        line = ProgressLine(view, stream)  # type: ignore[arg-type]
        started = time.monotonic()
        for _ in range(3000):
            line.draw()
        line.stop()
        handed_in = time.monotonic() - started
        assert not line.wait(0.2)  # still held by the paused terminal
        termios.tcflow(follower, termios.TCOON)
        seen = b""
        deadline = time.monotonic() + 20
        while not seen.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                seen += os.read(leader, 65536)
        assert line.wait(5)
    finally:
        stream.close()
        os.close(follower)
        os.close(leader)
    assert handed_in < 10, handed_in  # never waited for the terminal (before: blocked until the timeout)
    text = seen.decode()
    assert text.count("\n") == 1 and text.count("\r") < 3001
    # the final state, drawn by stop() (the terminal writes the newline as \\r\\n)
    assert text.removesuffix("\r\n").split("\r")[-1].startswith("3001/10"), text[-300:]


class _Sized(io.StringIO):
    """Written here, sized by a pseudo-terminal's follower end (``fd``), which the test resizes."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return True


def _columns(fd: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))


def test_a_redraw_after_the_terminal_narrowed_stays_within_it() -> None:
    """A terminal narrowed from 201 to 50 columns: the redraw blanks the old tail only up to the new width
    (49 characters in all); 70 more blanks would wrap, and the next \\r would leave the rows above behind."""
    long = snap({"completed": 3}, 8.0, restarts=12)
    leader, follower = pty.openpty()
    stream = _Sized(follower)
    try:
        _columns(follower, 201)
        line = ProgressLine(_Switch(long, long), stream, background=False)  # type: ignore[arg-type]
        line.draw()
        _columns(follower, 50)
        line.draw()
    finally:
        os.close(follower)
        os.close(leader)
    first, second = stream.getvalue().split("\r")[1:]
    assert first == render_progress(long, 200) and len(first) > 49
    assert second == render_progress(long, 49) and len(second) == 49


def _sweep_line(follower: int, columns: int) -> tuple[_Sized, SweepProgress]:
    _columns(follower, columns)
    stream = _Sized(follower)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stderr", stream)
        line = SweepProgress.wanted(None)
    assert line is not None
    return stream, line


_ROW = {"policy": "tool_first", "active": 16, "inflight": 4, "workers": 2, "seed": 0, "makespan_s": 5.6}


def test_the_sweeps_line_fits_a_narrow_terminal_and_blanks_a_longer_one() -> None:
    """The sweep's cell line on a 40-column terminal is cut to 39 characters (it was padded to 79: each
    redraw wrapped and left a row behind); a shorter line blanks the rest of the one before it."""
    leader, follower = pty.openpty()
    try:
        stream, report = _sweep_line(follower, 40)
        report(1, 3, _ROW)
        _columns(follower, 200)
        report(2, 3, _ROW)
        report(3, 3, {**_ROW, "policy": "fifo"})
        report.end()  # the last cell ended the line already
    finally:
        os.close(follower)
        os.close(leader)
    first, second, third = stream.getvalue().split("\r")[1:]
    full = "[2/3] tool_first 16 / 4 / 2 seed 0: makespan 5.600 s"
    assert first == full.replace("[2/3]", "[1/3]")[:36] + "..." and second == full
    assert third == "[3/3] fifo 16 / 4 / 2 seed 0: makespan 5.600 s      \n"


def test_a_sweep_stopped_early_ends_its_line() -> None:
    """Interrupted after 1 of 3 cells (`simulate` calls ``end`` then), the line ends, so the message that
    follows ("interrupted by SIGINT; …") starts its own line instead of being glued to the cell's."""
    leader, follower = pty.openpty()
    try:
        stream, report = _sweep_line(follower, 100)
        report(1, 3, _ROW)
        report.end()
        report.end()  # once
    finally:
        os.close(follower)
        os.close(leader)
    assert stream.getvalue() == "\r[1/3] tool_first 16 / 4 / 2 seed 0: makespan 5.600 s\n"


def test_the_width_is_one_less_than_the_terminal_and_120_when_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The terminal's columns, or ``COLUMNS`` when set to a positive number (it was ignored)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            for columns, width in ((60, 59), (10, 20), (0, 120)):  # 0 columns: the size was never set
                fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
                assert ProgressLine(_Switch(), tty)._width() == width, columns  # type: ignore[arg-type]
            for setting, width in (("100", 99), ("0", 59), ("-5", 59), ("wide", 59), ("", 59)):
                monkeypatch.setenv("COLUMNS", setting)
                fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
                assert ProgressLine(_Switch(), tty)._width() == width, setting  # type: ignore[arg-type]
    finally:
        os.close(follower)
        os.close(leader)
    monkeypatch.delenv("COLUMNS")
    assert ProgressLine(_Switch(), io.StringIO())._width() == 120  # type: ignore[arg-type]
    monkeypatch.setenv("COLUMNS", "70")
    assert ProgressLine(_Switch(), io.StringIO())._width() == 69  # type: ignore[arg-type]


class _Failing(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise OSError(5, "Input/output error")  # the terminal went away (ssh dropped)


@pytest.mark.parametrize("background", [True, False])
def test_a_stream_that_fails_ends_the_drawing_never_the_run(background: bool) -> None:
    stream = _Failing()
    line = ProgressLine(_Counting(), stream, background=background)  # type: ignore[arg-type]
    for _ in range(4):
        line.draw()
    line.stop()
    assert line.wait(5) and stream.writes == 1 and line.redraws == 5  # the first write failed: no other


def test_a_closed_stream_gets_no_line() -> None:
    closed = io.StringIO()
    closed.close()
    assert not progress_enabled(None, closed) and not progress_enabled(True, closed)


class _Clock:
    def __init__(self, now: float) -> None:
        self.t = now

    def now(self) -> float:
        return self.t


def test_elapsed_counts_from_the_origin_stops_at_the_end_and_is_never_negative() -> None:
    base = snap({}, None)
    limiters = {
        name: SimpleNamespace(snapshot=lambda value=value: value)
        for name, value in (("admission", base.admission), ("gate", base.model), ("dispatcher", base.cpu))
    }
    marks: dict[str, float | None] = {"origin": None, "ended": None}
    finished = {"completed": 1}
    clock = _Clock(100.0)
    view = RunView(
        total=10,
        clock=clock,  # type: ignore[arg-type]
        pool=SimpleNamespace(snapshot=lambda: base.pool),  # type: ignore[arg-type]
        finished=finished,
        origin=lambda: marks["origin"],
        ended=lambda: marks["ended"],
        **limiters,  # type: ignore[arg-type]
    )
    assert view.snapshot().elapsed_s is None  # before measurement
    marks["origin"] = 98.0
    assert view.snapshot().elapsed_s == 2.0
    clock.t = 97.5  # a reading just before the origin (another clock's grain): 0, not negative
    assert view.snapshot().elapsed_s == 0.0
    marks["ended"], clock.t = 99.25, 500.0  # cleanup after the end does not count
    taken = view.snapshot()
    assert taken.elapsed_s == 1.25 and taken.admission == base.admission and taken.pool == base.pool
    finished["completed"] = 5  # the snapshot is a copy: later counts do not change it
    assert taken.finished == {"completed": 1} and view.snapshot().completed == 5


def test_an_interrupted_sweep_says_so_on_a_line_of_its_own(tmp_path: Path) -> None:
    """`simulate --sweep` on a terminal, interrupted after its first cell: "interrupted by SIGINT; …" used
    to be glued to the cell's line ("…makespan 5.600 sinterrupted by SIGINT; 1 of 3 …")."""
    import typer

    from asyncroll.cli import app

    def interrupted(*_args: object, progress: SweepProgress, **_kwargs: object) -> None:
        progress(1, 3, _ROW)
        raise KeyboardInterrupt

    leader, follower = pty.openpty()
    try:
        _columns(follower, 100)
        stream = _Sized(follower)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("asyncroll.simulation.sweep.run_sweep", interrupted)
            patch.setattr("sys.stderr", stream)
            args = ["simulate", "--workload", SMOKE, "--output", tmp_path / "sweep", "--sweep", "--jobs", "1"]
            code = typer.main.get_command(app).main(list(map(str, args)), standalone_mode=False)
    finally:
        os.close(follower)
        os.close(leader)
    assert code == 130
    assert stream.getvalue().startswith(
        "\r[1/3] tool_first 16 / 4 / 2 seed 0: makespan 5.600 s\ninterrupted by SIGINT; "
    ), stream.getvalue()


def test_a_slow_run_gives_its_rate_per_hour() -> None:
    """Minutes-long trajectories end a few an hour: 9 in an hour was '0.00/s', read as a stalled run."""
    line = render_progress(snap({"completed": 9}, 3600.0), width=200)
    assert line.startswith("9/10  90% | 9.0/h | ETA 6:40 |")
    assert "| 0.042/h | ETA 216:00:00 |" in render_progress(snap({"completed": 1}, 86400.0), width=200)
    assert "| 0.10/s |" in render_progress(snap({"completed": 1}, 10.0), width=200)  # 360/h: still per second


def test_a_sweep_cell_of_microseconds_gives_its_makespan_to_the_microsecond() -> None:
    """A cell of µs turns printed "makespan 0.000 s"."""
    stream = io.StringIO()
    SweepProgress(stream)(1, 1, {**_ROW, "makespan_s": 0.000098})
    assert stream.getvalue() == "[1/1] tool_first 16 / 4 / 2 seed 0: makespan 0.000098 s\n"
