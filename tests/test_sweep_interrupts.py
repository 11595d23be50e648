"""A sweep stopped: SIGTERM as Ctrl-C does, an interruption between cells keeping the rows it finished, a
signal while the sweep waits for its cells killing them, and cell processes ending with a sweep killed
outright. Real processes, each with a hard timeout."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.children import end
from tests.conftest import REPO, tool_problem, write_workload
from tests.simulations import signal_and_wait, simulate_here, start_slow_cli, wait_until


@pytest.mark.timeout(90)
def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM used to kill the sweep outright; now, as on Ctrl-C, the running cell is cancelled, the
    rest never start, no table is written and the exit code is 130. Stopped before any simulation
    finished, the sweep's folder (its seed workloads alone) is removed, as a run's before its first files:
    it said "partial outputs in OUT", and the same command could not be given again."""
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=10, turns=2) for i in range(40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "sweep"
    args: list[str | Path] = ["--workload", workload, "--output", out, "--policies", "fifo,sync"]
    args += ["--seeds", "2", "--jobs", "1"]
    proc = start_slow_cli(tmp_path, "simulate", "--sweep", *args, "--progress")
    try:
        wait_until(lambda: (out / "workloads" / "seed-1.jsonl").exists(), "the sweep start", writer=proc)
        stderr = signal_and_wait(proc, signal.SIGTERM)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert "interrupted by SIGTERM; nothing written" in stderr, stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr
    assert not out.exists()


@pytest.mark.timeout(90)
def test_cell_processes_end_when_the_sweep_is_killed_outright(tmp_path: Path) -> None:
    """Cell processes ignore SIGTERM (the sweep stops them) and hold both ends of their task queue, so a
    sweep killed outright (SIGKILL, the OOM killer) used to leave them running forever. They watch the
    sweep and end with it."""
    import psutil

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=10, turns=2) for i in range(40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    args: list[str | Path] = [
        "--workload",
        workload,
        "--output",
        tmp_path / "sweep",
        "--policies",
        "fifo,sync",
    ]
    proc = start_slow_cli(tmp_path, "simulate", "--sweep", *args, "--seeds", "2", "--jobs", "2")

    def cells() -> list[psutil.Process]:
        found = []
        for child in sweep.children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                pass
        return found

    children: list[psutil.Process] = []
    try:
        sweep = psutil.Process(proc.pid)  # in the try: should it raise, the Popen is still ended
        wait_until(lambda: len(cells()) >= 2, "two cell processes", writer=proc)
        children = sweep.children(recursive=True)
        proc.kill()
        proc.communicate(timeout=30)
        _, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, [c.pid for c in alive]
    finally:
        end(proc)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def test_an_interrupted_sweep_keeps_the_simulations_it_finished(tmp_path: Path) -> None:
    """Ctrl-C between cells (here: raised by the progress callback after the second row, as the signal's
    KeyboardInterrupt would be) used to throw every finished row away: now they are written, marked
    partial, and the interruption says how many finished."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepInterrupted, SweepSpec, run_sweep

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo", "tool_first"), (2, 4), (2,), (1,), 2, 0.2)

    def stop_after_two(done: int, total: int, row: dict[str, object]) -> None:
        if done == 2:
            raise KeyboardInterrupt("SIGINT")

    out = tmp_path / "s"
    with pytest.raises(SweepInterrupted) as stopped:
        run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out, progress=stop_after_two)
    assert (stopped.value.done, stopped.value.total) == (2, 8)
    with (out / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["policy"], r["active"], r["seed"]) for r in rows] == [("fifo", "2", "0"), ("fifo", "4", "0")]
    document = json.loads((out / "sweep.json").read_text())
    assert document["complete"] is False and document["simulations"] == {"done": 2, "total": 8}
    assert document["stopped_by"] == "SIGINT" and len(document["rows"]) == 2
    assert (out / "sweep.md").read_text().startswith("**Partial: stopped by SIGINT after 2 of 8")
    assert not list(out.glob(".*.tmp"))
    whole = tmp_path / "whole"
    run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), whole)
    document = json.loads((whole / "sweep.json").read_text())
    assert document["complete"] is True and document["simulations"] == {"done": 8, "total": 8}
    assert document["stopped_by"] is None
    assert document["rows"][:2] == json.loads((out / "sweep.json").read_text())["rows"]


def test_a_sweep_stopped_while_waiting_on_its_cell_processes_names_the_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGHUP while a `--jobs 2` sweep waited on its cell processes: stderr said "interrupted by SIGHUP"
    but sweep.json's stopped_by and sweep.md said SIGINT (the CLI's handler raises a bare
    KeyboardInterrupt there; only a cell's own run names its signal)."""
    from asyncroll import cli_signals
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepInterrupted, SweepSpec, run_sweep

    monkeypatch.setattr(cli_signals, "_received", [])
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(3)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo", "tool_first"), (2,), (2,), (1,), 1, 0.2)

    def hangup_after_one(done: int, total: int, row: dict[str, object]) -> None:
        cli_signals._interrupt(signal.SIGHUP, None)  # the guard's handler, as SIGHUP arrives

    out = tmp_path / "s"
    with pytest.raises(SweepInterrupted) as stopped:
        run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out, progress=hangup_after_one)
    assert str(stopped.value) == "SIGHUP"
    assert json.loads((out / "sweep.json").read_text())["stopped_by"] == "SIGHUP"
    assert (out / "sweep.md").read_text().startswith("**Partial: stopped by SIGHUP after 1 of 2")


@pytest.mark.timeout(60)
def test_a_partial_sweeps_table_says_how_many_seeds_each_cell_stands_on(tmp_path: Path) -> None:
    """Stopped in its second seed, a sweep's cells stand on 2 seeds or 1; sweep.md showed their spreads
    side by side with no way to tell which were over fewer seeds."""
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepInterrupted, SweepSpec, run_sweep

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo", "tool_first"), (2, 4), (2,), (1,), 2, 0.2)

    def stop_after_five(done: int, total: int, row: dict[str, object]) -> None:
        if done == 5:  # seed 0's four cells, then seed 1's first (fifo at 2 / 2 / 1)
            raise KeyboardInterrupt("SIGINT")

    out = tmp_path / "s"
    with pytest.raises(SweepInterrupted):
        run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out, progress=stop_after_five)
    table = [line for line in (out / "sweep.md").read_text().splitlines() if line.startswith("|")]
    assert table[0].startswith("| policy | active | inflight | workers | seeds |")
    seeds = {tuple(cell.strip() for cell in row.split("|")[1:6]) for row in table[2:]}
    assert seeds == {
        ("fifo", "2", "2", "1", "2"),
        ("tool_first", "2", "2", "1", "1"),
        ("fifo", "4", "2", "1", "1"),
        ("tool_first", "4", "2", "1", "1"),
    }
    whole = tmp_path / "whole"  # every cell on the same seeds: no column for it
    run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), whole)
    assert (whole / "sweep.md").read_text().startswith("| policy | active | inflight | workers | makespan")


STOP_CELLS = """
import sys, time, os
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

from asyncroll.simulation import sweep_cells

if __name__ == "__main__":
    spawn = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, spawn, sweep_cells.cell_process, (os.getpid(),))
    pool.submit(time.sleep, 600)  # a long cell; cell processes ignore SIGINT and SIGTERM
    while not pool._processes:
        time.sleep(0.01)
    (cell,) = pool._processes.values()
    shutdown, calls = pool.shutdown, []

    def interrupted_once(*args, **kwargs):  # the second Ctrl-C, while the sweep waits for the cell
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return shutdown(*args, **kwargs)

    pool.shutdown = interrupted_once
    began = time.monotonic()
    sweep_cells.stop(pool, kill=False)
    print(len(calls), cell.exitcode, round(time.monotonic() - began, 1))
"""


@pytest.mark.timeout(60)
def test_a_signal_while_the_sweep_waits_for_its_cells_kills_them(tmp_path: Path) -> None:
    """A Ctrl-C that cut the sweep's wait for its running cells short left them running (they ignore
    signals) and the interpreter's exit waiting on them for ever; now it kills them and the wait ends."""
    script = tmp_path / "stop_cells.py"
    script.write_text(STOP_CELLS)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    calls, exitcode, seconds = out.stdout.split()
    assert calls == "2" and exitcode == str(-signal.SIGKILL)
    assert float(seconds) < 30


class _DiesWhenTold:
    """A custom arm whose cell process kills itself (as the OOM killer would) at its first decision, once
    the sweep has a row (it writes ``go``): a cell process that dies under the pool, after a finished cell."""

    name = "fifo"

    def __init__(self, go: Path) -> None:
        self.go = go

    def choose(self, snapshot: Any) -> Any:
        # no fixed deadline (a loaded machine's seed 0 may be slow): the cell process ends with the sweep,
        # and the test's hard timeout bounds the sweep
        wait_until(self.go.exists, "the sweep's first row", timeout=600)
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.timeout(90)
def test_a_cell_process_killed_under_the_sweep_is_a_failed_cell(tmp_path: Path) -> None:
    """A cell process killed outright (SIGKILL: the OOM killer) broke the pool: the sweep ended in a
    BrokenProcessPool traceback (exit 1) and threw away the simulations that had finished, leaving only
    the seed workloads. Now it is a failed cell: the rows so far are written, marked partial, and the
    error says the process was killed and by what."""
    import multiprocessing

    from asyncroll.errors import SimulationError
    from asyncroll.policies.baseline import Fifo
    from asyncroll.simulation.engine import SimulationSettings
    from asyncroll.simulation.sweep import SweepSpec, run_sweep

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(6)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = SweepSpec(("fifo",), (2,), (2,), (1,), 2, 0.2)
    go = tmp_path / "go"

    def dies_in_seed_1(seeded: Path) -> Any:
        return _DiesWhenTold(go) if seeded.name == "seed-1.jsonl" else Fifo()

    def first_row(done: int, total: int, row: dict[str, object]) -> None:
        go.touch()

    out = tmp_path / "s"
    with pytest.raises(SimulationError) as failed:
        run_sweep(
            workload,
            tmp_path,
            {},
            spec,
            SimulationSettings(),
            out,
            custom={"dies": dies_in_seed_1},
            jobs=2,
            progress=first_row,
        )
    message = str(failed.value)
    assert "a sweep cell process ended abruptly (killed by SIGKILL" in message, message
    assert f"in {out} (sweep.md, marked partial)" in message, message
    document = json.loads((out / "sweep.json").read_text())
    assert document["complete"] is False and 1 <= document["simulations"]["done"] < 4
    assert document["stopped_by"] == "a cell process that ended abruptly"
    assert (out / "sweep.md").read_text().startswith("**Partial: stopped by a cell process that ended")
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("table", ["sweep.csv", "sweep.md", "sweep.json"])
def test_a_signal_while_a_whole_sweeps_tables_are_written_leaves_them_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    """Every cell had finished and the tables were being written when Ctrl-C came: its KeyboardInterrupt
    cut the writing short, and the CLI took the sweep for one stopped before any simulation finished:
    it removed the folder, tables already written with it, and said 'nothing written' (exit 130). A
    signal after the last cell leaves the sweep whole (docs/SIMULATION.md): the tables are written, exit 0."""
    from asyncroll.simulation import sweep

    opened = sweep.open_staged

    def interrupted(staged: Path, mode: str) -> Any:
        if staged.name == f".{table}.tmp":
            signal.raise_signal(signal.SIGINT)  # as Ctrl-C arrives
        return opened(staged, mode)

    monkeypatch.setattr(sweep, "open_staged", interrupted)
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(3)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "s"
    args: list[str | Path] = ["--workload", workload, "--output", out, "--policies", "fifo,sync"]
    args += ["--seeds", "2", "--jobs", "1"]
    result = simulate_here("--sweep", *args)
    assert result.exit_code == 0, result.output
    document = json.loads((out / "sweep.json").read_text())
    assert document["complete"] is True and document["simulations"] == {"done": 4, "total": 4}
    assert (out / "sweep.md").read_text().startswith("| policy |")
    assert len((out / "sweep.csv").read_text().splitlines()) == 5
    assert not list(out.glob(".*.tmp"))


SIGNAL_AT_START = """
import os, signal, sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from asyncroll.simulation.engine import SimulationSettings
from asyncroll.simulation.sweep import SweepSpec, run_sweep

spawn = ProcessPoolExecutor._spawn_process


def spawn_then_signal(self):  # Ctrl-C to the terminal's process group as a cell process starts
    spawn(self)
    child = list(self._processes.values())[-1]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        os.kill(child.pid, sig)


if __name__ == "__main__":
    ProcessPoolExecutor._spawn_process = spawn_then_signal
    here = Path(sys.argv[1])
    spec = SweepSpec(("fifo", "tool_first"), (2,), (2,), (1,), 2, 0.2)
    rows = run_sweep(here / "w.jsonl", here, {}, spec, SimulationSettings(), here / "s", jobs=2)
    print(len(rows))
"""


@pytest.mark.timeout(60)
def test_a_stop_signal_as_the_cell_processes_start_is_left_to_the_sweep(tmp_path: Path) -> None:
    """A Ctrl-C to the terminal's process group (the sweep and its cells) while the cell processes were
    starting, before each set itself to ignore it, interrupted their imports: each printed a
    KeyboardInterrupt traceback (a SIGTERM or SIGHUP killed it, breaking the pool). They start with the
    stop signals blocked until they ignore them: the sweep alone acts on the signal."""
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(3)]
    write_workload(tmp_path / "w.jsonl", problems)
    script = tmp_path / "signal_at_start.py"
    script.write_text(SIGNAL_AT_START)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0 and out.stdout.split() == ["4"], out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.usefixtures("sigint_not_ignored")
def test_a_signal_while_a_finished_sweep_prints_its_table_keeps_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a finished sweep printed its table (stdout a pager's pipe, full: a 500-cell table is
    78 kB) was taken for a sweep stopped before any simulation finished: the folder, its tables and all,
    was removed ('interrupted by SIGINT; nothing written', exit 130). The sweep is kept, and said to
    have finished (still exit 130: the printing was stopped)."""
    from asyncroll.commands import simulate

    said = simulate.say

    def interrupted(text: str) -> None:
        signal.raise_signal(signal.SIGINT)  # as Ctrl-C arrives while stdout blocks
        said(text)

    monkeypatch.setattr(simulate, "say", interrupted)
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(3)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "s"
    args: list[str | Path] = ["--workload", workload, "--output", out, "--policies", "fifo,sync"]
    result = simulate_here("--sweep", *args, "--seeds", "2", "--jobs", "1")
    assert result.exit_code == 130, result.output
    assert f"interrupted by SIGINT; the sweep had finished: its tables are in {out}" in result.output
    assert json.loads((out / "sweep.json").read_text())["complete"] is True
    assert len((out / "sweep.csv").read_text().splitlines()) == 5


def test_a_table_that_cannot_be_written_while_a_signal_waits_is_still_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop signal during the tables' writing waits until they are written, then is dropped; a table that
    could not be written meanwhile (a full disk) was dropped with it: the deferred signal's KeyboardInterrupt
    replaced the write error and was swallowed, so the sweep said it had finished, 'tables in' a folder with
    no sweep.json (exit 0)."""
    from asyncroll.simulation import sweep

    def full(staged: Path, mode: str) -> Any:
        if staged.name == ".sweep.json.tmp":
            signal.raise_signal(signal.SIGINT)  # as Ctrl-C arrives
            raise OSError(errno.ENOSPC, "No space left on device")
        return opened(staged, mode)

    opened = sweep.open_staged
    monkeypatch.setattr(sweep, "open_staged", full)
    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p", model_ms=10, cpu_ms=30, turns=2)])
    out = tmp_path / "s"
    args: list[str | Path] = ["--workload", workload, "--output", out, "--policies", "fifo", "--seeds", "1"]
    result = simulate_here("--sweep", *args, "--jobs", "1")
    assert result.exit_code not in (0, 130), result.output
    assert "sweep.json: cannot write (No space left on device)" in result.output
    assert not (out / "sweep.json").exists()


def test_an_unexpected_error_in_a_cell_keeps_the_simulations_that_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error no one foresaw (a defect, not a failed simulation) ended the sweep in its traceback and
    threw the finished rows away; they are written, marked partial, and the error says where."""
    from asyncroll.simulation import sweep
    from asyncroll.simulation.engine import SimulationSettings

    real = sweep.run_cell

    def breaks_on_the_third(cell: sweep.Cell) -> Any:
        if cell.seed == 1 and cell.point == (2, 2, 1):
            raise RuntimeError("a defect")
        return real(cell)

    monkeypatch.setattr(sweep, "run_cell", breaks_on_the_third)
    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=30, turns=2) for i in range(4)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    spec = sweep.SweepSpec(("fifo",), (2,), (2,), (1,), 2, 0.2)
    out = tmp_path / "s"
    with pytest.raises(RuntimeError, match="a defect") as failed:
        sweep.run_sweep(workload, tmp_path, {}, spec, SimulationSettings(), out)
    assert failed.value.__notes__ == [f"the simulation that finished is in {out} (sweep.md, marked partial)"]
    document = json.loads((out / "sweep.json").read_text())
    assert document["complete"] is False and document["simulations"]["done"] == 1
    assert document["stopped_by"] == "an unexpected error (RuntimeError)"
    assert len((out / "sweep.csv").read_text().splitlines()) == 2


@pytest.mark.timeout(120)
def test_a_hangup_to_the_whole_process_group_leaves_no_traceback(tmp_path: Path) -> None:
    """The terminal closing sends SIGHUP to the whole foreground process group: multiprocessing's resource
    tracker, started as the `--jobs 2` pool was made, ignores only SIGINT and SIGTERM, so it died, was
    relaunched, and printed a warning and a KeyError traceback for each semaphore the pool then released.
    It now starts with the stop signals blocked, as the cell processes do."""
    from tests.simulations import SLOW_CLI

    problems = [tool_problem(f"p{i}", model_ms=10, cpu_ms=10, turns=2) for i in range(40)]
    workload = write_workload(tmp_path / "w.jsonl", problems)
    out = tmp_path / "sweep"
    script = tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    args = ["--workload", str(workload), "--output", str(out), "--policies", "fifo,sync", "--seeds", "4"]
    proc = subprocess.Popen(
        [sys.executable, str(script), "simulate", "--sweep", *args, "--jobs", "2", "--no-progress"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )
    try:
        import psutil

        sweep = psutil.Process(proc.pid)  # in the try: should it raise, the Popen is still ended

        def cells() -> int:
            with contextlib.suppress(psutil.Error):
                return sum("spawn_main" in " ".join(c.cmdline()) for c in sweep.children())
            return 0

        wait_until(lambda: cells() >= 2, "two cell processes", writer=proc)
        os.killpg(proc.pid, signal.SIGHUP)
        _, stderr = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 130, stderr
    assert "interrupted by SIGHUP" in stderr, stderr
    assert "Traceback" not in stderr and "resource_tracker" not in stderr, stderr
