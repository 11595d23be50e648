"""The workload file itself: a regular file (never a pipe), read twice (validated, then streamed by the
run) and unchanged in between."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncroll.errors import WorkloadError
from asyncroll.workload import iter_problems, scan_workload
from asyncroll.workload import scan as workload_scan
from tests.conftest import REPO
from tests.workload_scans import GOOD

# --- the workload file itself: a regular file, read twice, unchanged in between --------------------------


def _smoke_copy(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_bytes((REPO / "examples" / "smoke.jsonl").read_bytes())
    return path


@pytest.mark.timeout(10)
def test_a_pipe_is_refused_without_reading_it(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes to it: opening it must not block
    problems = scan_workload(fifo, tmp_path, scripted=True).problems
    assert len(problems) == 1 and problems[0].startswith(f"{fifo}: not a regular file (a pipe)")
    assert "save it to a file first" in problems[0]
    read, write = os.pipe()
    try:
        os.write(write, (REPO / "examples" / "smoke.jsonl").read_bytes())
        os.close(write)
        piped = Path(f"/dev/fd/{read}")
        scan = scan_workload(piped, tmp_path, scripted=True)
        assert scan.count == 0 and "not a regular file (a pipe)" in scan.problems[0]
        with pytest.raises(WorkloadError, match="not a regular file"):
            scan.raise_if_invalid()
        assert os.read(read, 10) == b'{"id": "sm'  # the scan left the pipe's content unread
    finally:
        os.close(read)
    assert scan_workload(tmp_path, tmp_path, scripted=True).problems == [
        f"{tmp_path}: is a directory, not a workload file"
    ]


def test_a_symlink_to_a_regular_file_is_accepted(tmp_path: Path) -> None:
    link = tmp_path / "link.jsonl"
    link.symlink_to(_smoke_copy(tmp_path))
    scan = scan_workload(link, REPO / "examples", scripted=True)
    assert scan.problems == [] and scan.count == 3
    assert [pid for _, pid, _ in iter_problems(link, identity=scan.identity)][-1] == "smoke-answer"


def test_a_compressed_workload_is_named_as_such_with_the_way_to_its_lines(tmp_path: Path) -> None:
    """A ``workload.jsonl.gz`` (or a zip of it) was told "holds NUL bytes ...: a UTF-16 or UTF-32 file? save
    it as UTF-8" on its first line (or "not valid UTF-8"), which sends a user to re-encode a file that needs
    decompressing; the converters already name such a source. Nothing of it is read as lines."""
    import gzip
    import zipfile

    smoke = (REPO / "examples" / "smoke.jsonl").read_bytes()
    packed = tmp_path / "w.jsonl.gz"
    packed.write_bytes(gzip.compress(smoke, mtime=0))
    zipped = tmp_path / "w.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("w.jsonl", smoke)
    for path, what in ((packed, "gzip-compressed"), (zipped, "a zip archive")):
        scan = scan_workload(path, tmp_path, scripted=True, flag="--workload")
        assert scan.count == 0 and len(scan.problems) == 1, scan.problems
        assert scan.problems[0].startswith(f"--workload {path}: {what}, not JSON text: "), scan.problems
        assert "UTF-16" not in scan.problems[0]
    assert "zcat" in scan_workload(packed, tmp_path, scripted=True).problems[0]


def test_the_way_to_an_xz_or_bzip2_workloads_lines_works_whatever_the_files_name(tmp_path: Path) -> None:
    """A compressed workload named like the text it holds (``w.jsonl``) was told `xz -dk FILE` (which skips a
    file without the ``.xz`` suffix: "Filename has an unknown suffix") or `bzip2 -dk FILE` (which writes
    ``FILE.out``); the way given must work for any name, as `zcat FILE > …` does for gzip."""
    import bz2
    import lzma
    import shlex
    import shutil

    if not (shutil.which("xzcat") and shutil.which("bzcat")):
        pytest.skip("needs xzcat and bzcat (xz-utils, bzip2)")
    smoke = (REPO / "examples" / "smoke.jsonl").read_bytes()
    for name, packed in (("xz.jsonl", lzma.compress(smoke)), ("bz2.jsonl", bz2.compress(smoke))):
        path = tmp_path / name
        path.write_bytes(packed)
        problem = scan_workload(path, tmp_path, scripted=True).problems[0]
        command = problem.split("`")[1]
        assert "FILE" in command and "workload.jsonl" in command, problem
        subprocess.run(
            command.replace("FILE", shlex.quote(str(path))), shell=True, cwd=tmp_path, check=True, timeout=10
        )
        assert (tmp_path / "workload.jsonl").read_bytes() == smoke, problem
        (tmp_path / "workload.jsonl").unlink()


@pytest.mark.timeout(60)
def test_run_from_a_pipe_is_a_usage_error_and_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", "run", "--workload", "/dev/stdin", "--output", str(out)],
        input=(REPO / "examples" / "smoke.jsonl").read_bytes(),
        capture_output=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert b"/dev/stdin: not a regular file (a pipe)" in result.stderr and not out.exists()


def test_a_file_rewritten_in_place_after_validation_is_not_read(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    assert scan.problems == [] and scan.identity is not None
    inode = path.stat().st_ino
    with path.open("r+b") as handle:  # same inode, new (never validated) content
        handle.write(b'{"id": "evil", "prompt": "p", "script": [{"type": "final", "answer": 1}]}\n')
        handle.truncate()
    assert path.stat().st_ino == inode
    with pytest.raises(WorkloadError, match="changed since it was validated") as info:
        next(iter_problems(path, identity=scan.identity))
    why = "changed since it was validated (replaced, or rewritten in place)"
    assert info.value.problems == [f"{path}: {why}; stopped before line 1"]  # before any line was read


def test_a_same_size_rewrite_is_caught_by_its_modification_time(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    assert scan.identity is not None
    path.write_bytes(path.read_bytes().replace(b"smoke-add", b"smoke-ADD"))
    os.utime(path, ns=(scan.identity.mtime_ns + 1_000, scan.identity.mtime_ns + 1_000))
    assert path.stat().st_size == scan.identity.size
    with pytest.raises(WorkloadError, match="changed since it was validated"):
        next(iter_problems(path, identity=scan.identity))


def test_a_rewrite_in_place_during_the_stream_stops_it(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    for identity in (scan.identity, None):  # without the scan's identity: checked against the first open
        stream = iter_problems(path, identity=identity)
        assert next(stream)[1] == "smoke-add"
        with path.open("ab") as handle:
            handle.write(b'{"id": "late", "prompt": "p", "script": [{"type": "final", "answer": 1}]}\n')
        with pytest.raises(WorkloadError, match="stopped before line 2"):
            next(stream)
        path.write_bytes((REPO / "examples" / "smoke.jsonl").read_bytes())
        scan = scan_workload(path, REPO / "examples", scripted=True)


def test_a_file_that_changes_while_it_is_scanned_is_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _smoke_copy(tmp_path)
    original = workload_scan.check_problem

    def check_then_append(*args: Any) -> list[tuple[str, str]]:
        with path.open("ab") as handle:
            handle.write(b"\n")
        return original(*args)

    monkeypatch.setattr(workload_scan, "check_problem", check_then_append)
    problems = scan_workload(path, REPO / "examples", scripted=True).problems
    assert problems == [f"{path}: changed while it was being validated; validate it again when stable"]


def test_a_file_replaced_by_rename_during_the_stream_is_harmless(tmp_path: Path) -> None:
    path = _smoke_copy(tmp_path)
    scan = scan_workload(path, REPO / "examples", scripted=True)
    stream = iter_problems(path, identity=scan.identity)
    assert next(stream)[1] == "smoke-add"
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(GOOD) + "\n")
    os.replace(other, path)  # the open handle keeps the validated file
    assert [pid for _, pid, _ in stream] == ["smoke-sleep", "smoke-answer"]
    # ... but a run that had not opened it yet refuses the replacement
    with pytest.raises(WorkloadError, match="changed since it was validated"):
        next(iter_problems(path, identity=scan.identity))


def _interrupted_fdopen(real: Any) -> Any:
    """``os.fdopen`` interrupted (Ctrl-C, SIGTERM) after its file object took the descriptor over: the
    object is freed as the interrupt unwinds, closing the descriptor (closed here at once, as it is)."""

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        real(fd, *args, **kwargs).close()
        raise KeyboardInterrupt

    return fdopen


def test_an_interrupt_inside_fdopen_is_not_turned_into_a_bad_file_descriptor_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM landing there made the caller close the descriptor a second time: ``OSError: [Errno 9]
    Bad file descriptor`` replaced the interrupt (a sweep stopped with exit 1, not 130), and the second
    close could have closed another file that had reused the number."""
    from asyncroll.convert.rows import RowSource

    path = _smoke_copy(tmp_path)
    monkeypatch.setattr(os, "fdopen", _interrupted_fdopen(os.fdopen))
    with pytest.raises(KeyboardInterrupt):
        scan_workload(path, REPO / "examples", scripted=True)
    with pytest.raises(KeyboardInterrupt):
        list(RowSource(path).scan())


@pytest.mark.timeout(60)
def test_a_run_stopped_before_its_workload_was_read_through_closes_the_workload(tmp_path: Path) -> None:
    """The run streams its workload from a generator, which closes the file only when it is read through or
    collected: a run stopped midway (SIGTERM) returned with the file still open, held for as long as its
    outcome's traceback was (seen as a leaked descriptor across tests)."""
    import asyncio
    import signal
    from unittest import mock

    import psutil

    from asyncroll.config import build_config
    from asyncroll.event_log import EventLog
    from asyncroll.simulation import engine
    from tests.conftest import tool_problem, write_workload

    workload = write_workload(
        tmp_path / "w.jsonl", [tool_problem(f"p{i}", model_ms=100, cpu_ms=100) for i in range(40)]
    )
    cfg = build_config({"workload": workload, "output": tmp_path / "run", "max_active_trajectories": 2})
    start = EventLog.start_measurement

    def stop_soon(log: EventLog) -> float:  # a second of virtual time into the measured window
        asyncio.get_running_loop().call_later(1.0, signal.raise_signal, signal.SIGTERM)
        return start(log)

    with mock.patch.object(EventLog, "start_measurement", stop_soon):
        outcome = engine.simulate(cfg, engine.SimulationSettings(), ["test"], signals=True)
    assert outcome.status == "interrupted", outcome.error
    held = [f.path for f in psutil.Process().open_files() if Path(f.path) == workload]
    assert held == [], held
