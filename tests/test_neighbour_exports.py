"""Commands run on a run directory from another terminal.

Two ``asyncroll timeline`` processes regenerating the same run's exports at once (two terminals, or a
script run twice): each writes under a temporary name of its own, so neither renames or truncates the
other's half-written file and both succeed. Real processes at a deterministic point: the first waits,
its trace.json written under its temporary name and not yet renamed, until the second has finished
(a hook, 30 s at most). And ``asyncroll optimum`` on a run still going. Every process has a hard
timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.children import end
from tests.cli_runs import SMOKE, cli
from tests.cli_runs import _wait_for as wait_for
from tests.conftest import REPO, invoke, tool_problem, write_workload

pytestmark = pytest.mark.timeout(120)

#: ``asyncroll timeline RUN`` (argv[3]) whose trace.json, once written under its temporary name, waits
#: there until the file argv[2] exists, after creating the file argv[1].
PAUSED = """
import sys, time
from pathlib import Path
import asyncroll.outputs.trace as trace
paused, go = Path(sys.argv[1]), Path(sys.argv[2])
real_write = trace._write
def _write(path, *args):
    real_write(path, *args)
    paused.write_text(path.name)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
trace._write = _write
sys.argv = ["asyncroll", "timeline", sys.argv[3]]
from asyncroll.cli import main
main()
"""


def test_two_timeline_commands_at_once_on_one_run_both_succeed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    made = invoke("simulate", "--workload", SMOKE, "--output", out)  # the run: made in this process
    assert made.exit_code == 0, made.stderr
    paused, go = tmp_path / "paused", tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED, str(paused), str(go), str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not paused.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert paused.exists(), first.communicate(timeout=10)
        second = cli("timeline", out)  # the neighbour, start to end, while the first waits
        go.touch()
        _, first_err = first.communicate(timeout=60)
    finally:
        end(first)
    assert second.returncode == 0, second.stderr
    assert first.returncode == 0, first_err  # was: FileNotFoundError: '.trace.json.tmp' -> 'trace.json'
    json.loads((out / "trace.json").read_text())
    json.loads((out / "run.json").read_text())
    assert (out / "timeline.html").read_text().rstrip().endswith("</html>")
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


def test_optimum_of_a_run_still_going_says_so_not_that_it_stopped(tmp_path: Path) -> None:
    """``asyncroll optimum RUN`` from another terminal while the run works: the work recorded so far is
    solved, and what it prints says the run is still going; not that it never finished or was killed."""
    problems = [tool_problem(f"p{i}", model_ms=5, cpu_ms=60_000) for i in range(2)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "run"
    run = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", "run", "--workload", str(workload), "--output", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(out / "events.jsonl", '"event":"cpu_started"', writer=run)
        solved = cli("optimum", out, "--time-limit", "10", "--threads", "1", "--json")
        assert run.poll() is None  # it was still going throughout
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # its workers stopped by the run itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(60)
        end(run)
    assert solved.returncode == 0, solved.stderr
    said = solved.stderr + " ".join(json.loads(solved.stdout)["notes"])
    assert "still going" in said
    for wrong in ("never finished", "stopped before", "when the run stopped"):
        assert wrong not in said, said


def test_what_a_killed_writer_left_staged_is_cleared_by_the_next_writer(tmp_path: Path) -> None:
    """A writer killed mid-write (the OOM killer, during a large trace.json) leaves its staging file. With
    one name per process the next writer no longer overwrote it, and it stayed beside the run for good (a
    trace can be hundreds of MB). One a live process is writing (a neighbour, now) is left alone."""
    out = tmp_path / "run"
    made = invoke("simulate", "--workload", SMOKE, "--output", out)  # the run: made in this process
    assert made.exit_code == 0, made.stderr
    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # a pid no process can have
    dead = [
        out / f".trace.json.{never}.tmp",
        out / f".timeline.html.{never}.tmp",
        out / f".run.json.{never}.tmp",
    ]
    for path in dead:
        path.write_text("{half of it")
    live = out / f".trace.json.{os.getpid()}.tmp"  # this test's process: alive throughout
    live.write_text("{being written")
    again = cli("timeline", out)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in dead if p.exists()] == []
    assert live.exists()


@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "existing-folder"])
def test_what_a_killed_report_left_staged_is_cleared_by_the_next_report(
    tmp_path: Path, existing: bool
) -> None:
    """``report`` stages its files in a hidden folder (beside its output, or inside it when the folder is
    there already) and renames them into place. One killed midway (an OOM kill while drawing the figure)
    left that folder, under a random name no later report ever looked at. A dead process's folder is now
    removed by the next report, one a live process is writing is left alone, and one left under this
    process's own pid (a dead namesake's) is no obstacle."""
    from asyncroll.experiment.report import write_report
    from tests.test_experiment_inputs import comparison

    source = tmp_path / "comparison.json"
    source.write_text(json.dumps(comparison()))
    out = tmp_path / "r"
    home = out if existing else tmp_path
    if existing:
        out.mkdir()
    never = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # a pid no process can have
    dead = home / f".r.{never}.tmp"
    own = home / f".r.{os.getpid()}.tmp"
    live = home / f".r.{os.getppid()}.tmp"  # pytest's parent: alive throughout
    for folder in (dead, own, live):
        folder.mkdir()
        (folder / "aggregate.json").write_text("{half of it")
    write_report(source, out, figure=False)
    assert not dead.exists() and not own.exists()
    assert (live / "aggregate.json").read_text() == "{half of it"
    assert sorted(p.name for p in out.iterdir()) == (
        sorted(["REPORT.md", "aggregate.json", live.name]) if existing else ["REPORT.md", "aggregate.json"]
    )


#: ``asyncroll report --comparison argv[3] --output argv[4]`` that, once it has decided whether the
#: output folder exists, creates the file argv[1] and waits until the file argv[2] exists.
PAUSED_REPORT = """
import sys, time
from pathlib import Path
import asyncroll.experiment.report as report
paused, go = Path(sys.argv[1]), Path(sys.argv[2])
real_clear = report.clear_staged
def clear_staged(path):
    paused.touch()
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    real_clear(path)
report.clear_staged = clear_staged
sys.argv = ["asyncroll", "report", "--comparison", sys.argv[3], "--output", sys.argv[4]]
from asyncroll.cli import main
main()
"""


def test_two_reports_at_once_into_one_new_folder_both_succeed(tmp_path: Path) -> None:
    """Two ``asyncroll report`` of one comparison into the same new --output at once (two terminals, two
    CI jobs): the one that finds the folder made by the other meanwhile replaces its files, as a report
    into an existing report's folder does. It failed, exit 1, with 'cannot write the report: Directory
    not empty' (its staged folder could not be renamed over the other's)."""
    from tests.test_experiment_inputs import comparison

    source = tmp_path / "comparison.json"
    source.write_text(json.dumps(comparison()))
    out = tmp_path / "r"
    paused, go = tmp_path / "paused", tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_REPORT, str(paused), str(go), str(source), str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not paused.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert paused.exists(), first.communicate(timeout=10)
        second = cli("report", "--comparison", source, "--output", out)  # start to end, while the first waits
        go.touch()
        _, first_err = first.communicate(timeout=60)
    finally:
        end(first)
    assert second.returncode == 0, second.stderr
    assert first.returncode == 0, first_err
    assert sorted(p.name for p in out.iterdir()) == ["REPORT.md", "aggregate.json"]
    json.loads((out / "aggregate.json").read_text())
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
