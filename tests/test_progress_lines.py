"""An explicit ``--progress`` into a file or pipe (a log under nohup or a batch scheduler): the progress line
written whole, one every ``LOG_PERIOD_S`` and once more at the end, with no ``\\r`` and never cut to a
terminal's width; without ``--progress`` (the default) such a stream still gets nothing. The period is
tested on a virtual clock; one real run writes its lines into a pipe."""

from __future__ import annotations

import asyncio
import io
import re
import sys
from pathlib import Path

import pytest

from asyncroll.clock import VirtualClock
from asyncroll.runtime.progress import LOG_PERIOD_S, LiveView, ProgressLine, RunSnapshot
from tests.cli_runs import SMOKE, cli
from tests.conftest import invoke
from tests.test_live_view import snap


class _Ticking:
    """A run view whose elapsed time is the virtual clock's, 100 trajectories ending at one a second."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock

    def snapshot(self) -> RunSnapshot:
        at = self._clock.now()
        return snap({"completed": int(at)}, at, total=100)


def test_an_explicit_progress_into_a_file_writes_a_whole_line_every_period() -> None:
    """Under nohup or a batch scheduler stderr is a file: the line redrawn in place was never drawn there
    (it would garble the file), and nothing said how a run of hours went until it ended."""
    clock = VirtualClock()
    log = io.StringIO()
    # written here, not by the line's own thread (which writes only the latest line handed to it: a
    # virtual clock hands them faster than a thread writes)
    line = ProgressLine(_Ticking(clock), log, LOG_PERIOD_S, background=False, in_place=False)  # type: ignore[arg-type]

    async def a_run_of(seconds: float) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(line.run())
            await clock.sleep(seconds)
            line.stop()

    clock.run(a_run_of(2.5 * LOG_PERIOD_S))
    lines = log.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in log.getvalue()  # whole lines only, each ended
    # one at the start, one a period, and the last at the end (75 s: at 0, 30, 60 and 75 s)
    assert [text.split(" ", 1)[0] for text in lines[:-1]] == ["0/100", "30/100", "60/100", "75/100"], lines
    assert all(len(text) > 120 for text in lines[:-1])  # the whole line: no terminal's width cuts it
    # a run's live view: lines into a file with --progress; nothing by default (no --progress) or with
    # --no-progress
    for setting, drawn in ((True, True), (None, False), (False, False)):
        view = LiveView(_Ticking(clock), progress=setting, metrics_port=None, stream=io.StringIO())  # type: ignore[arg-type]
        assert (view.progress is not None) is drawn, setting


@pytest.mark.timeout(120)
def test_a_real_run_with_progress_into_a_pipe_writes_its_lines(tmp_path: Path) -> None:
    done = cli("run", "--workload", SMOKE, "--output", tmp_path / "run", "--policy", "fifo", "--progress")
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if re.match(r"\d+/3 ", line)]
    assert lines[0].startswith("0/3   0% | starting (workers, warm-up)"), done.stderr
    assert lines[-1].startswith("3/3 100% |") and "done in" in lines[-1], done.stderr


def test_the_help_states_the_period_the_lines_are_written_at() -> None:
    shown = " ".join(invoke("run", "--help").output.split())
    assert f"Into a file or pipe only when given: one whole line every {LOG_PERIOD_S:g} s." in shown


def test_an_explicit_progress_with_stderr_closed_writes_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``2>&-`` Python's ``sys.stderr`` is None: no line, rather than a writer thread that dies on its
    first write."""
    monkeypatch.setattr(sys, "stderr", None)
    view = LiveView(_Ticking(VirtualClock()), progress=True, metrics_port=None)  # type: ignore[arg-type]
    assert view.progress is None


@pytest.mark.timeout(60)
def test_a_metrics_port_with_stderr_closed_serves_without_writing_its_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``2>&-`` a run with ``--metrics-port`` failed before its measurement (AttributeError: None
    has no ``write``) where it would say the exporter's address: it now serves, and says nothing."""
    monkeypatch.setattr(sys, "stderr", None)
    view = LiveView(_Ticking(VirtualClock()), progress=None, metrics_port=0)  # type: ignore[arg-type]

    async def start_and_close() -> dict[str, object] | None:
        async with asyncio.TaskGroup() as tg:
            described = view.start(tg)
            await view.aclose()
        return described

    described = asyncio.run(start_and_close())
    assert described is not None and view.progress is None, described
