"""``--output`` on a shared machine: paths given by mistake are each refused (exit 2) with the path and
the reason, before anything is created, never with a traceback; and two commands given the same one
at once: the loser never touches the winner's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, invoke
from tests.unprivileged import as_user, skip_unless_bound

SMOKE = REPO / "examples" / "smoke.jsonl"
TOO_LONG = "x" * 300  # one name longer than any file system's 255 bytes: every stat of it fails


#: each command that takes an --output: ``run``, ``simulate`` and a sweep, smoke-sized
EVERY_OUTPUT_COMMAND = pytest.mark.parametrize(
    "command",
    [
        ["run", "--workload", SMOKE, "--no-progress"],
        ["simulate", "--workload", SMOKE],
        ["simulate", "--workload", SMOKE, "--sweep", "--policies", "fifo"],
    ],
    ids=["run", "simulate", "sweep"],
)


@EVERY_OUTPUT_COMMAND
def test_an_output_name_too_long_is_a_usage_error(
    command: list[str | Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was an OSError out of the command (a traceback, exit 1).
    monkeypatch.chdir(tmp_path)
    result = invoke(*command, "--output", TOO_LONG)
    assert result.exit_code == 2, result.output
    assert f"error: --output {TOO_LONG}: cannot be used: File name too long" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert list(tmp_path.iterdir()) == []


def test_a_replay_to_an_output_name_too_long_is_a_usage_error(tmp_path: Path) -> None:
    recorded = tmp_path / "recorded"
    assert invoke("simulate", "--workload", SMOKE, "--output", recorded).exit_code == 0
    result = invoke("simulate", "--from-run", recorded, "--output", tmp_path / TOO_LONG)
    assert result.exit_code == 2, result.output
    assert f"{TOO_LONG}: cannot be used: File name too long" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recorded"]


@pytest.mark.timeout(60)
def test_the_timeline_of_a_run_this_user_may_not_write_in_says_so(tmp_path: Path) -> None:
    """Another user's run (or one made read-only): each export failed with its staging file's name,
    ``export failed: trace.json: PermissionError: [Errno 13] Permission denied: 'RUN/.trace.json.123.tmp';
    timeline.html: PermissionError: ... 'RUN/.asyncroll-export-xyz'``, exit 1. Run bound by file
    permissions as an ordinary user (root writes in a folder of mode 0555): ``tests/unprivileged.py``."""
    skip_unless_bound()
    run = tmp_path / "run"
    assert invoke("simulate", "--workload", SMOKE, "--output", run).exit_code == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    run.chmod(0o555)
    try:
        command = [sys.executable, "-m", "asyncroll.cli", "timeline", str(run)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=45, preexec_fn=as_user())
    finally:
        run.chmod(0o755)
    assert result.returncode == 2, result.stderr
    assert (
        f"error: {run}: this user may not write there, where trace.json and timeline.html go" in result.stderr
    )
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_the_timeline_of_a_run_never_writes_through_a_link_planted_at_a_staging_name(tmp_path: Path) -> None:
    """A run folder another user may write in (a group's, made under umask 002): a symbolic link at
    ``.trace.json.PID.tmp`` (or run.json's, timeline.html's), PID the next ``asyncroll timeline``'s, made
    it truncate and overwrite the file the link named, anywhere that user may write, with the export."""
    run = tmp_path / "run"
    assert invoke("simulate", "--workload", SMOKE, "--output", run).exit_code == 0
    victims = {}
    for name in ("trace.json", "timeline.html", "run.json"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("precious\n")
        victims[name] = victim
        (run / f".{name}.{os.getpid()}.tmp").symlink_to(victim)  # invoke runs in this process
    result = invoke("timeline", run)
    assert result.exit_code == 0, result.output
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n", name
        assert not (run / name).is_symlink() and (run / name).stat().st_size > 100, name
    assert "exports_regenerated" in json.loads((run / "run.json").read_text())


def test_the_timeline_of_a_name_too_long_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("timeline", tmp_path / TOO_LONG)
    assert result.exit_code == 2, result.output
    assert f"{TOO_LONG}: File name too long" in result.stderr


def test_an_output_under_a_file_or_at_a_dangling_link_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    under = invoke("simulate", "--workload", SMOKE, "--output", tmp_path / "afile" / "run")
    assert under.exit_code == 2 and "cannot be used: Not a directory" in under.stderr
    dangling = invoke("simulate", "--workload", SMOKE, "--output", tmp_path / "link")
    assert dangling.exit_code == 2 and "already exists; asyncroll never overwrites a run" in dangling.stderr
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert not (tmp_path / "nowhere").exists()  # the link was not followed to make its target


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_a_command_interrupted_before_its_run_never_removes_a_directory_another_run_made(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two commands with the same --output: B made the directory and was setting up (no run.json yet)
    # when A, still validating its workload, was interrupted; A removed B's directory as if its own
    # (reproduced with real processes: B then failed writing run.json).
    out = tmp_path / "run"

    def another_run_wins_then_ctrl_c(*args: Any, **kwargs: Any) -> None:
        out.mkdir()  # B made it first ...
        (out / "workers").mkdir()  # ... and is setting up
        raise KeyboardInterrupt  # A's Ctrl-C, still validating

    monkeypatch.setattr("asyncroll.runtime.run.prepare", another_run_wins_then_ctrl_c)
    monkeypatch.setattr("asyncroll.simulation.engine.prepare", another_run_wins_then_ctrl_c)
    result = invoke(command, "--workload", SMOKE, "--output", out)
    assert result.exit_code == 130, result.output
    assert "interrupted by SIGINT; nothing written" in result.stderr
    assert (out / "workers").is_dir()  # B's, untouched


@pytest.mark.parametrize("command", ["run", "simulate", "replay"])
@pytest.mark.usefixtures("sigint_not_ignored")
def test_a_signal_just_as_the_output_directory_is_made_leaves_no_directory(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGINT right after mkdir returned, before the command recorded that it made the directory: the
    # command said "nothing written" and left the empty directory, no run.json, blocking the path (seen
    # with a real SIGTERM on 3.13, about 1 run in 30).
    import signal

    out = tmp_path / "run"
    given: list[str | Path] = ["--workload", SMOKE]
    if command == "replay":
        assert invoke("simulate", "--workload", SMOKE, "--output", tmp_path / "recorded").exit_code == 0
        command, given = "simulate", ["--from-run", tmp_path / "recorded"]
    mkdir = Path.mkdir

    def made_then_signalled(self: Path, *args: Any, **kwargs: Any) -> None:
        mkdir(self, *args, **kwargs)
        if self == out:
            signal.raise_signal(signal.SIGINT)  # its handler runs before this returns

    monkeypatch.setattr(Path, "mkdir", made_then_signalled)
    result = invoke(command, *given, "--output", out, *(["--no-progress"] * (command == "run")))
    assert result.exit_code == 130, result.output
    assert "interrupted by SIGINT; nothing written" in result.stderr
    assert not out.exists()


def test_a_run_whose_directory_is_removed_under_it_ends_failed_with_the_reason(tmp_path: Path) -> None:
    # A scratch cleaner removes the run directory mid-run: the final receipt could not be written, and
    # its in-place fallback raised FileNotFoundError out of the run (a traceback, reproduced with a real
    # `asyncroll run` and `rm -rf` mid-run). The run fails naming what it could not write.
    import shutil

    from asyncroll.outputs.rundir import RunDirectory

    out = tmp_path / "run"
    out.mkdir()
    files = RunDirectory(out, {"config": {}}, 0.0)
    files.transition("running", 1.0)
    files.write_result(b'{"id": "p0"}\n')
    shutil.rmtree(out)
    error = files.finish({"status": "complete"}, "complete", 2.0)
    assert error is not None
    gone = f"{out} was moved or removed while the run ran"
    assert error.startswith(f"summary.json: cannot write ({gone})")
    # not "it still says 'running'": no run.json says anything any more
    assert error.endswith(
        f"run.json: cannot write ({gone}); it was gone with the directory, last written 'running'"
    )
    assert set(files.exports_failed) == {"trace.json", "timeline.html"}
    assert not out.exists()  # nothing made anew


def test_the_worker_log_folder_is_made_with_the_first_worker_after_the_receipt(tmp_path: Path) -> None:
    # It was made when the run was set up, before run.json: on a file system out of inodes its mkdir
    # was a traceback that left the output directory behind (reproduced on a tmpfs with nr_inodes=2).
    from asyncroll.config import build_config
    from asyncroll.runtime.collaborators import process_worker_factory
    from asyncroll.workers import ProcessWorker
    from asyncroll.workload import scan_workload

    out = tmp_path / "run"
    cfg = build_config({"workload": SMOKE, "output": out})
    factory = process_worker_factory(cfg, scan_workload(SMOKE, SMOKE.parent, scripted=True), lambda path: "")
    assert not out.exists()  # nothing made yet (the output directory itself is prepare's)
    out.mkdir()
    worker = factory(0, 0)  # not started: a worker process starts only when the pool starts it
    assert isinstance(worker, ProcessWorker)
    assert (out / "workers").is_dir() and worker.log_path == out / "workers" / "worker-0.log"


def test_worker_logs_are_never_written_through_a_link_planted_in_the_run(tmp_path: Path) -> None:
    """A run folder another user may write in (a group's, made under umask 002): a symbolic link planted
    at ``RUN/workers`` or ``RUN/workers/worker-0.log`` before the first worker started made every tool's
    prints go into (append to) the file or folder the link named, anywhere this user may write."""
    from asyncroll.config import build_config
    from asyncroll.runtime.collaborators import process_worker_factory
    from asyncroll.workers import ProcessWorker
    from asyncroll.workers.spawn import _open_log
    from asyncroll.workload import scan_workload

    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    cfg = build_config({"workload": SMOKE, "output": out})
    factory = process_worker_factory(cfg, scan_workload(SMOKE, SMOKE.parent, scripted=True), lambda path: "")
    (out / "workers").symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a folder this run made"):
        factory(0, 0)
    (out / "workers").unlink()
    worker = factory(0, 0)
    assert isinstance(worker, ProcessWorker) and worker.log_path is not None
    log_path, victim = worker.log_path, tmp_path / "victim"
    victim.write_text("precious\n")
    log_path.symlink_to(victim)
    with pytest.raises(OSError):
        _open_log(log_path)
    assert victim.read_text() == "precious\n"
    log_path.unlink()
    log, offset = _open_log(log_path)  # a real log: made, then appended to by a replacement
    assert log is not None and offset == 0
    log.write(b"x")
    log.close()
    log, offset = _open_log(log_path)
    assert log is not None and offset == 1
    log.close()


def _another_run_at(out: Path) -> dict[str, bytes]:
    """A second run started at ``out`` (after the first one's directory was moved away): its files."""
    out.mkdir()
    mine = {
        name: f"the second run's {name}\n".encode() for name in ("run.json", "summary.json", "events.jsonl")
    }
    for name, data in mine.items():
        (out / name).write_bytes(data)
    return mine


def test_a_run_whose_directory_is_moved_writes_its_last_files_there_not_into_a_new_run_at_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `mv X X.old` during a long run, then a second run with --output X: when the first one finished it
    # wrote its summary.json, final run.json and exports into X, over the second run's (its exports drawn
    # from the second run's events), and said "complete … outputs: X"; X.old said "running" forever.
    # Reproduced with two real `asyncroll simulate` processes.
    from asyncroll.outputs.rundir import RunDirectory

    out, moved = tmp_path / "run", tmp_path / "run.old"
    finish = RunDirectory.finish
    second: dict[str, bytes] = {}

    def moved_then_finished(self: RunDirectory, *args: Any, **kwargs: Any) -> str | None:
        out.rename(moved)
        second.update(_another_run_at(out))
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(RunDirectory, "finish", moved_then_finished)
    result = invoke("simulate", "--workload", SMOKE, "--output", out)
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == second  # untouched
    receipt = json.loads((moved / "run.json").read_text())
    assert receipt["status"] == "complete" and receipt["exports"]["trace.json"]["ok"]
    assert json.loads((moved / "summary.json").read_text())["counts"]["completed"] == 3
    assert (moved / "timeline.html").is_file() and (moved / "trace.json").is_file()
    assert f"outputs: {moved}" in result.stdout
    assert f"{out} was moved while the run ran" in result.stderr


def test_a_run_whose_directory_is_removed_never_writes_into_a_new_one_at_its_path(tmp_path: Path) -> None:
    # `rm -rf X` during a run, then a second run made X: the first one's last files went into it.
    import shutil

    from asyncroll.outputs.rundir import RunDirectory

    out = tmp_path / "run"
    out.mkdir()
    files = RunDirectory(out, {"config": {}}, 0.0)
    files.transition("running", 1.0)
    shutil.rmtree(out)
    second = _another_run_at(out)
    error = files.finish({"status": "complete"}, "complete", 2.0)
    assert error is not None and f"{out} was moved or removed while the run ran" in error
    assert {p.name: p.read_bytes() for p in out.iterdir()} == second


@pytest.mark.parametrize("then", ["removed", "replaced"])
def test_a_run_whose_directory_is_removed_says_so_and_offers_no_command_that_cannot_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    # It printed "outputs: X" for a directory that was gone and, for each export, "`asyncroll timeline X`
    # writes it from events.jsonl once there is room": there was no events.jsonl, nor a full disk.
    # "replaced": `rm -rf X` and a second run at X (a script run again, a retried CI job) while the first
    # ran: the first said "outputs: X" and offered `asyncroll timeline X` for its exports, the second
    # run's directory (reproduced with two real `asyncroll run` processes).
    import shutil

    from asyncroll.outputs.rundir import RunDirectory

    out = tmp_path / "run"
    finish = RunDirectory.finish
    second: dict[str, bytes] = {}

    def removed_then_finished(self: RunDirectory, *args: Any, **kwargs: Any) -> str | None:
        shutil.rmtree(out)
        if then == "replaced":
            second.update(_another_run_at(out))
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(RunDirectory, "finish", removed_then_finished)
    result = invoke("simulate", "--workload", SMOKE, "--output", out)
    assert result.exit_code == 1, result.output
    assert f"outputs: {out} (no longer there)" in result.stdout
    assert f"summary.json: cannot write ({out} was moved or removed while the run ran)" in result.stderr
    assert "asyncroll timeline" not in result.stderr
    if then == "replaced":
        assert {p.name: p.read_bytes() for p in out.iterdir()} == second
    else:
        assert not out.exists()


@pytest.mark.parametrize("then", ["removed", "replaced"])
def test_a_replay_whose_directory_is_removed_fails_with_the_reason_and_removes_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    # simulate --from-run then compared the replay's endings with the run's from the removed directory:
    # an uncaught "--from-run REPLAY: cannot read results.jsonl" (a traceback, and no "error: run failed").
    # And with no run.json at --output it took itself for a replay that found no room for its first
    # run.json, and removed the directory there: "replaced", a second replay's, preparing at that path.
    import shutil

    from asyncroll.outputs.rundir import RunDirectory

    source, out = tmp_path / "source", tmp_path / "replay"
    assert invoke("simulate", "--workload", SMOKE, "--output", source).exit_code == 0
    finish = RunDirectory.finish

    def removed_then_finished(self: RunDirectory, *args: Any, **kwargs: Any) -> str | None:
        shutil.rmtree(out)
        if then == "replaced":  # another replay at the same path, its workload written, no run.json yet
            out.mkdir()
            (out / "replay-workload.jsonl").write_text("{}\n")
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(RunDirectory, "finish", removed_then_finished)
    result = invoke("simulate", "--from-run", source, "--output", out)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"error: run failed: summary.json: cannot write ({out} was moved or removed" in result.stderr
    assert f"nothing written, {out} removed" not in result.stderr
    if then == "removed":
        assert f"outputs: {out} (no longer there)" in result.stdout
        assert not out.exists()
    else:
        assert (out / "replay-workload.jsonl").read_text() == "{}\n"


def test_a_worker_started_after_the_run_directory_moved_logs_there_not_into_a_new_run_at_its_path(
    tmp_path: Path,
) -> None:
    # A replacement worker made its log folder at --output and appended to worker-0.log there: after
    # `mv X X.old` and a second run at X, into the second run's worker log.
    from asyncroll.config import build_config
    from asyncroll.outputs.rundir import RunDirectory
    from asyncroll.runtime.collaborators import process_worker_factory
    from asyncroll.workers import ProcessWorker
    from asyncroll.workload import scan_workload

    out, moved = tmp_path / "run", tmp_path / "run.old"
    out.mkdir()
    files = RunDirectory(out, {"config": {}}, 0.0)
    cfg = build_config({"workload": SMOKE, "output": out})
    scan = scan_workload(SMOKE, SMOKE.parent, scripted=True)
    factory = process_worker_factory(cfg, scan, lambda path: "", files.here)
    out.rename(moved)
    second = _another_run_at(out)
    worker = factory(0, 1)  # not started
    assert isinstance(worker, ProcessWorker) and worker.log_path == moved / "workers" / "worker-0.log"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == second


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="/proc")
def test_a_run_whose_receipt_cannot_be_written_keeps_no_handle_on_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handle on the run's directory (kept to follow it if moved) was opened before run.json and never
    # closed when run.json found no room: one descriptor lost per run in a process running many (a
    # bench, a test session).
    import errno

    import asyncroll.outputs.receipt as receipt
    from asyncroll.clock import VirtualClock
    from asyncroll.errors import OutputWriteError
    from asyncroll.outputs.rundir import open_run_files

    def full(path: Path, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(receipt, "write_json_atomic", full)
    out = tmp_path / "run"
    out.mkdir()
    before = _open_fds()
    with pytest.raises(OutputWriteError, match="nothing written"):
        open_run_files(out, {"config": {}}, VirtualClock())
    assert _open_fds() == before
    assert not out.exists()


def test_a_timeline_that_writes_one_export_of_two_records_it_and_says_which_failed(tmp_path: Path) -> None:
    """trace.json is a directory (cannot be replaced); timeline.html is rewritten all the same: run.json's
    ``exports_regenerated`` says so (it was left as before, naming no new export) and the error says
    which was written as well as which failed."""
    run = tmp_path / "run"
    assert invoke("simulate", "--workload", SMOKE, "--output", run).exit_code == 0
    (run / "trace.json").unlink()
    (run / "trace.json").mkdir()
    (run / "timeline.html").unlink()
    result = invoke("timeline", run)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: export failed: trace.json: ")
    assert result.stderr.endswith(f" ({run / 'timeline.html'} was written)\n")
    regenerated = json.loads((run / "run.json").read_text())["exports_regenerated"]
    assert (regenerated["trace.json"]["ok"], regenerated["timeline.html"]["ok"]) == (False, True)
    assert (run / "timeline.html").is_file() and (run / "trace.json").is_dir()


def test_text_outputs_a_receipt_rewrite_and_a_server_log_never_write_through_a_planted_link(
    tmp_path: Path,
) -> None:
    """A symbolic link at the name (planted in a folder another user may write in) made a
    ``TextOutput`` (a perturbed or replayed workload), run.json's rewrite in place and an experiment's
    server/client log write into the file the link named."""
    from asyncroll.errors import OutputWriteError
    from asyncroll.experiment.server import ManagedProcess
    from asyncroll.outputs.lines import TextOutput
    from asyncroll.outputs.receipt import _rewrite_in_place

    victim = tmp_path / "victim"
    victim.write_text("precious and long enough to hold a small rewrite in place\n")
    before = victim.read_text()
    link = tmp_path / "out.jsonl"
    link.symlink_to(victim)
    with pytest.raises(OutputWriteError, match=r"out\.jsonl: cannot write"), TextOutput(link) as out:
        out.write("x\n")
    assert _rewrite_in_place(link, {"a": 1}) is False  # the receipt is then staged and renamed instead
    log = tmp_path / "arm" / "server.log"
    log.parent.mkdir()
    log.symlink_to(victim)
    with pytest.raises(OSError):
        ManagedProcess([sys.executable, "-c", "print('hi')"], log).start()
    assert victim.read_text() == before and link.is_symlink()
    real = tmp_path / "real.jsonl"
    with TextOutput(real) as out:  # a plain file is written as before
        out.write("x\n")
    assert real.read_text() == "x\n"
