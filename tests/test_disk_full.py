"""A run on a disk that fills up: every line already on disk stays valid and the run ends ``failed``.

The disk is made "full" for real with ``RLIMIT_FSIZE`` in a child process: a write that crosses the
limit is short (part of it lands), the next one fails (``EFBIG``; Python ignores ``SIGXFSZ``), as a
write to a full file system is short and then fails with ``ENOSPC``. No mount or root needed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, tool_problem

pytestmark = pytest.mark.timeout(120)
SMOKE = REPO / "examples" / "smoke.jsonl"


def _limited(limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))


def child(
    script: str, arg: Path, limit_bytes: int | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``script`` in a new interpreter with ``arg`` (files past ``limit_bytes`` cannot grow: a full disk)."""
    return subprocess.run(
        [sys.executable, "-c", script, str(arg)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=None if limit_bytes is None else lambda: _limited(limit_bytes),
        check=check,
    )


def test_a_line_file_keeps_whole_lines_and_fails_once(tmp_path: Path) -> None:
    script = r"""
import json, sys
from pathlib import Path
from asyncroll.outputs.lines import LineFile, OutputWriteError
f = LineFile(Path(sys.argv[1]))
raised, written = 0, 0
for i in range(1000):
    try:
        f.write(b'{"i": %6d, "pad": "%s"}\n' % (i, b"x" * 83))  # 108 bytes each
        written += 0 if raised else 1
    except OutputWriteError as exc:
        raised += 1
        message = str(exc)
f.close()
print(json.dumps({"raised": raised, "written": written, "message": message,
                  "error": str(f.error)}))
"""
    path = tmp_path / "lines.jsonl"
    out = child(script, path, limit_bytes=10_050)  # the 93rd line of 108 bytes crosses it: a short write
    report = json.loads(out.stdout)
    assert report["raised"] == 1  # once; later lines are dropped quietly, the owner already knows
    assert report["written"] == 93  # 10,044 bytes fit, the 94th line does not
    assert "lines.jsonl: cannot write" in report["message"] and report["error"] == report["message"]
    data = path.read_bytes()
    assert len(data) == 93 * 108 and data.endswith(b"\n")  # the partial line was cut off again
    assert [json.loads(line)["i"] for line in data.splitlines()] == list(range(93))


def test_a_run_whose_disk_fills_up_ends_failed_with_every_line_valid(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"p{i}",
                    "prompt": "add",
                    "tools": [{"name": "add"}],
                    "reference_answer": "5",
                    "script": [
                        {"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}, "latency_ms": 5},
                        {"type": "final", "answer": "5", "latency_ms": 5},
                    ],
                }
            )
            + "\n"
            for i in range(300)
        )
    )
    out = tmp_path / "run"
    command = ["simulate", "--workload", str(workload), "--output", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *command],
        capture_output=True,
        text=True,
        timeout=100,
        preexec_fn=lambda: _limited(48 << 10),  # events.jsonl outgrows 48 KiB; run.json does not
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "events.jsonl: cannot write" in proc.stderr
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and receipt["exit_code"] == 1
    assert receipt["error"].startswith("events.jsonl: cannot write")
    lines = (out / "events.jsonl").read_bytes()
    assert lines.endswith(b"\n")
    events = [json.loads(line) for line in lines.splitlines()]  # every line whole
    assert "measurement_started" in {e["event"] for e in events} and len(events) > 100
    for line in (out / "results.jsonl").read_bytes().splitlines():
        json.loads(line)
    summary = json.loads((out / "summary.json").read_text())  # small: it fits under the limit
    assert summary["status"] == "failed"
    assert not list(out.glob(".*.tmp"))  # no temporary file left behind


def test_an_export_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    from asyncroll.outputs.trace import write_atomic

    with pytest.raises(UnicodeEncodeError):
        write_atomic(tmp_path / "timeline.html", "\ud800")  # fails after its temporary file was opened
    assert list(tmp_path.iterdir()) == []


def test_an_experiment_lock_that_cannot_be_written_is_a_clean_error(tmp_path: Path) -> None:
    script = r"""
import sys
import threading
from pathlib import Path
from asyncroll.errors import UsageError
from asyncroll.experiment.lock import OutputLock
try:
    OutputLock.acquire(Path(sys.argv[1]))
except UsageError as exc:
    print(exc)
"""
    out = child(script, tmp_path, limit_bytes=10)  # the holder's record does not fit
    assert "experiment.lock: cannot record the runner" in out.stdout, out.stderr


def test_a_receipt_with_no_room_to_grow_stays_whole_compact_or_as_it_was(tmp_path: Path) -> None:
    # The disk fills up before the final receipt: the temporary copy cannot be written, nor can the
    # in-place rewrite grow the file. It used to be rewritten in place anyway, cut short at the limit:
    # a half run.json (invalid JSON) and an OSError out of the run (a traceback).
    script = r"""
import json, resource, sys
from pathlib import Path
from asyncroll.outputs.lines import OutputWriteError
from asyncroll.outputs.receipt import Receipt
path = Path(sys.argv[1]) / "run.json"
receipt = Receipt(path, {"config": {f"k{i}": {"a": [1, 2, 3]} for i in range(40)}}, 0.0)
size = path.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))  # not one byte more: a full disk
receipt.transition("failed", 1.0, error="events.jsonl: cannot write", exports={"trace.json": "x" * 200})
first = json.loads(path.read_text())
try:
    receipt.update(error="y" * 2 * size)  # no form of it fits
    second = "no error"
except OutputWriteError as exc:
    second = str(exc)
print(json.dumps({"first": first, "second": second, "after": json.loads(path.read_text()), "size": size}))
"""
    out = child(script, tmp_path)
    report = json.loads(out.stdout)
    assert report["first"]["status"] == "failed" and report["first"]["error"] == "events.jsonl: cannot write"
    assert report["first"]["exports"] == {"trace.json": "x" * 200}
    assert report["second"].startswith("run.json: cannot write") and "still says 'failed'" in report["second"]
    assert report["after"] == report["first"]  # the last receipt written, whole
    assert (tmp_path / "run.json").stat().st_size <= report["size"]
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left behind


def test_a_final_receipt_with_no_room_fails_the_run_with_the_reason(tmp_path: Path) -> None:
    script = r"""
import json, resource, sys
from pathlib import Path
from asyncroll.outputs.rundir import RunDirectory
out = Path(sys.argv[1])
files = RunDirectory(out, {"config": {}}, 0.0)
files.transition("running", 1.0)
size = (out / "run.json").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
error = files.finish({"status": "complete"}, "complete", 2.0)
print(json.dumps({"error": error, "receipt": json.loads((out / "run.json").read_text())}))
"""
    out = child(script, tmp_path)
    report = json.loads(out.stdout)
    assert report["error"] == "run.json: cannot write (File too large); it still says 'running'"
    assert report["receipt"]["status"] == "running"  # whole, if stale: the command reports the failure


def test_a_run_with_no_room_even_for_its_receipt_is_a_clean_failure_that_leaves_nothing(
    tmp_path: Path,
) -> None:
    # It was a traceback (an OSError out of the run), and an empty output directory left behind, which
    # the next try with the same --output was refused for.
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", "simulate", "--workload", str(SMOKE), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: _limited(100),  # run.json does not fit
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"error: run failed: run.json: cannot write (File too large); nothing written, {out} removed" in (
        proc.stderr
    )
    assert not out.exists()


def test_an_event_log_that_cannot_be_created_fails_the_run_in_its_receipt(tmp_path: Path) -> None:
    from asyncroll.clock import VirtualClock
    from asyncroll.errors import OutputWriteError
    from asyncroll.outputs.rundir import open_run_files

    out = tmp_path / "run"
    out.mkdir()
    (out / "events.jsonl").write_text("someone else's\n")  # cannot be created anew (O_EXCL)
    with pytest.raises(OutputWriteError, match=r"^events.jsonl: cannot create \(File exists\)$"):
        open_run_files(out, {"config": {}}, VirtualClock())
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and receipt["exit_code"] == 1
    assert receipt["error"] == "events.jsonl: cannot create (File exists)"
    assert (out / "events.jsonl").read_text() == "someone else's\n"  # untouched


def test_events_held_before_the_measurement_that_find_no_room_never_escape_the_close(
    tmp_path: Path,
) -> None:
    # A run interrupted during start-up on a full disk: the held events were written at close, the
    # first failure raised out of the run's cleanup (a traceback, exit 1 instead of 130, run.json left
    # saying "preparing"; reproduced with a real run, SIGINT and a filled tmpfs).
    script = r"""
import json, sys
from pathlib import Path
from asyncroll.clock import VirtualClock
from asyncroll.event_log import EventLog
from asyncroll.events import WorkerReady
log = EventLog(VirtualClock(), Path(sys.argv[1]) / "events.jsonl")
for index in range(3):
    log.emit(WorkerReady(worker=index, generation=0, pid=None, startup_s=0.1))
log.close()  # the measurement never started: the held events are written now, and find no room
print(json.dumps({"error": str(log.write_error)}))
"""
    out = child(script, tmp_path, limit_bytes=150, check=False)  # the first line fits, the second does not
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["error"].startswith("events.jsonl: cannot write")
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["worker_ready"]  # whole lines only


def test_an_interrupted_run_whose_summary_finds_no_room_stays_interrupted(tmp_path: Path) -> None:
    # run.json said failed (exit_code 1) while the command exited 130 saying "interrupted".
    script = r"""
import json, resource, sys
from pathlib import Path
from asyncroll.outputs.rundir import RunDirectory
out = Path(sys.argv[1])
files = RunDirectory(out, {"config": {f"k{i}": {"a": [1, 2, 3]} for i in range(40)}}, 0.0)
files.transition("running", 1.0)
size = (out / "run.json").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
error = files.finish({"pad": "x" * 2 * size}, "interrupted", 2.0, "interrupted by SIGINT")
print(json.dumps({"error": error, "receipt": json.loads((out / "run.json").read_text())}))
"""
    out = child(script, tmp_path)
    report = json.loads(out.stdout)
    assert report["error"] == "interrupted by SIGINT; summary.json: cannot write (File too large)"
    receipt = report["receipt"]
    assert receipt["status"] == "interrupted" and receipt["exit_code"] == 130
    assert receipt["error"] == report["error"]


def test_a_run_whose_last_event_line_finds_no_room_fails_instead_of_raising(tmp_path: Path) -> None:
    # Every trajectory done, the disk full just then: measurement_finished, the first line that failed,
    # raised out of the run's cleanup (a traceback, no final run.json).

    from asyncroll.clock import VirtualClock
    from asyncroll.config import build_config
    from asyncroll.runtime.run import Run, prepare
    from asyncroll.runtime.virtual_worker import builtin_duration, virtual_factory
    from tests.conftest import tool_problem, write_workload
    from tests.descriptors import make_writes_fail

    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p0", model_ms=5, cpu_ms=5)])
    out = tmp_path / "run"
    clock = VirtualClock()

    def disk_full_after_the_last_trajectory(event: object) -> None:
        if getattr(event, "event", None) != "trajectory_finished":
            return
        make_writes_fail(out / "events.jsonl")  # any later write of an event fails

    run = Run(
        prepare(build_config({"workload": workload, "output": out}), ["test"]),
        clock,
        worker_factory=virtual_factory(clock, builtin_duration),
        subscribers=(disk_full_after_the_last_trajectory,),
    )
    outcome = clock.run(run.execute())
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error is not None and outcome.error.startswith("events.jsonl: cannot write")
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and receipt["error"] == outcome.error
    events = [json.loads(line)["event"] for line in (out / "events.jsonl").read_bytes().splitlines()]
    assert "trajectory_finished" in events and "measurement_finished" not in events


def test_an_export_that_failed_for_no_lack_of_room_is_not_told_to_wait_for_room(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run at ``ulimit -n`` whose exports found no descriptor said 'writes it from events.jsonl once there
    is room': a full disk's advice. Only a full disk, a quota or a file size limit gets it."""
    from asyncroll.commands.common import warn_exports

    (tmp_path / "events.jsonl").write_text("")
    warn_exports(
        {
            "trace.json": "OSError: [Errno 24] Too many open files: '/run/.asyncroll-export-1'",
            "timeline.html": "OSError: [Errno 28] No space left on device",
        },
        tmp_path,
    )
    trace, timeline = capsys.readouterr().err.splitlines()
    assert trace.startswith("warning: trace.json was not written (OSError: [Errno 24]")
    assert trace.endswith("writes it from events.jsonl"), trace
    assert timeline.endswith("writes it from events.jsonl once there is room"), timeline


class _GatedWrites:
    """``write_all`` of the lines module for files named ``name``: each waits for ``gate`` (a file system
    that is slow, as NFS is when its server is busy); the ``fail_at``-th (from 1) fails as a full disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, fail_at: int | None = None) -> None:
        import asyncroll.outputs.lines as lines

        self.gate, self.calls = threading.Event(), 0
        self.name, self.fail_at, self._real = name, fail_at, lines.write_all
        monkeypatch.setattr(lines, "write_all", self)

    def __call__(self, fd: int, data: bytes, offset: int | None = None) -> None:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(self.name):
            self._real(fd, data, offset)
            return
        assert self.gate.wait(60), "the test never opened the gate"
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real(fd, data, offset)


def test_a_real_runs_event_log_goes_on_while_a_write_is_held_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On NFS a write can take milliseconds (seconds when the server is busy); written from the event loop,
    # every event held up every trajectory (2 ms a write: makespan +12%; 20 ms: 3.1 times as long).
    from asyncroll.clock import SystemClock
    from asyncroll.event_log import EventLog
    from asyncroll.events import WorkerReady

    writes = _GatedWrites(monkeypatch, "events.jsonl")
    log = EventLog(SystemClock(), tmp_path / "events.jsonl")
    log.start_measurement()

    def emit_all() -> None:
        for i in range(50):
            log.emit(WorkerReady(worker=i, generation=0, pid=None, startup_s=0.1))

    emitter = threading.Thread(target=emit_all)
    emitter.start()
    emitter.join(30)
    held, written = emitter.is_alive(), (tmp_path / "events.jsonl").read_bytes()
    writes.gate.set()  # the file system answers
    emitter.join(30)
    assert not held, "emit waited on the file system"
    assert written == b""  # every event emitted while the first write was still held up
    log.close()  # writes what is queued first
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["worker"] for line in lines] == list(range(50))  # every line, in order
    assert log.write_error is None


@pytest.mark.parametrize("close_fails", [False, True])
def test_a_background_line_file_still_raises_its_first_failure_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, close_fails: bool
) -> None:
    from asyncroll.outputs.lines import LineFile, OutputWriteError

    writes = _GatedWrites(monkeypatch, "lines.jsonl", fail_at=3)
    writes.gate.set()
    f = LineFile(tmp_path / "lines.jsonl", background=True)
    if close_fails:  # NFS reports a failed write again when the file is closed (EIO)
        real_close, fd = os.close, f._fd

        def close(n: int) -> None:
            real_close(n)
            if n == fd:
                raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "close", close)
    for i in range(3):
        f.write(b'{"i": %d}\n' % i)
    deadline = threading.Event()
    for _ in range(3000):  # until the writer's thread has met the failure (no sleep-and-hope)
        if f.error is not None:
            break
        deadline.wait(0.01)
    assert f.error is not None
    with pytest.raises(OutputWriteError, match=r"^lines.jsonl: cannot write \(No space left on device\)"):
        f.write(b'{"i": 3}\n')  # the first write after the failure raises it
    f.write(b'{"i": 4}\n')  # once: later lines are dropped quietly
    f.close()
    assert str(f.error).startswith("lines.jsonl: cannot write")
    assert (tmp_path / "lines.jsonl").read_bytes() == b'{"i": 0}\n{"i": 1}\n'


def test_a_real_run_whose_last_result_line_finds_no_room_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written by a thread, the last line's failure is raised by no later write: the run checks at close.
    from tests.metrics_loopback import real_clock_run

    writes = _GatedWrites(monkeypatch, "results.jsonl", fail_at=2)
    writes.gate.set()
    problems = [tool_problem(f"p{i}", model_ms=1, cpu_ms=1) for i in range(2)]
    outcome, _capture, summary = real_clock_run(tmp_path, problems, max_active_trajectories=1)
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.error is not None and outcome.error.startswith("results.jsonl: cannot write")
    assert summary["status"] == "failed"
    receipt = json.loads((tmp_path / "run" / "run.json").read_text())
    assert receipt["status"] == "failed" and receipt["error"] == outcome.error
    assert len((tmp_path / "run" / "results.jsonl").read_bytes().splitlines()) == 1
    # events.jsonl's last line says how the run ended as run.json does (it said complete, no reason)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    finished = [e for e in events if e["event"] == "measurement_finished"]
    assert [(e["status"], e["reason"]) for e in finished] == [("failed", outcome.error)]


def test_a_background_failure_raised_while_the_writer_records_it_is_raised_only_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer's thread set the error, then whether it counted as raised: a write on the event loop
    # raising it in between had its mark overwritten, and the next line raised the same error again.
    from asyncroll.outputs.lines import LineFile, OutputWriteError

    raised_here = threading.Event()

    class Interleaved(LineFile):
        @property  # type: ignore[override]
        def _writer(self) -> Any:
            if self.__dict__.get("error") is not None and threading.current_thread().name.endswith(" writer"):
                assert raised_here.wait(30)  # the event loop raises the error now, before it is marked
            return self.__dict__["writer"]

        @_writer.setter
        def _writer(self, value: Any) -> None:
            self.__dict__["writer"] = value

    writes = _GatedWrites(monkeypatch, "lines.jsonl", fail_at=1)
    writes.gate.set()
    f = Interleaved(tmp_path / "lines.jsonl", background=True)
    f.write(b'{"i": 0}\n')
    for _ in range(3000):  # until the writer's thread has met the failure (no sleep-and-hope)
        if f.error is not None:
            break
        raised_here.wait(0.01)
    with pytest.raises(OutputWriteError):
        f.write(b'{"i": 1}\n')
    raised_here.set()
    queue = f.__dict__["writer"]._lines
    for _ in range(3000):  # until the writer's thread is done with the failed line
        if not queue:
            break
        threading.Event().wait(0.01)
    assert not queue
    f.write(b'{"i": 2}\n')  # once: dropped quietly (it raised the same error again)
    f.close()
    assert (tmp_path / "lines.jsonl").read_bytes() == b""


def test_a_background_writer_that_meets_another_exception_still_fails_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only OutputWriteError was caught in the writer's thread: any other (a MemoryError on a host out of
    # memory) ended the thread with a traceback, the lines queued after it were lost with no error (a run
    # said complete), and once 16 MiB were queued every write waited for a thread that was gone: a hang.
    import asyncroll.outputs.lines as lines
    from asyncroll.outputs.lines import LineFile, OutputWriteError

    real = lines.write_all

    def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
        if data.startswith(b'{"i": 1}'):
            raise MemoryError
        real(fd, data, offset)

    monkeypatch.setattr(lines, "write_all", write_all)
    monkeypatch.setattr(lines, "QUEUE_BYTES", 20)  # two lines: the third waits for the thread
    f = LineFile(tmp_path / "lines.jsonl", background=True)

    def write_five() -> None:
        for i in range(5):
            with contextlib.suppress(OutputWriteError):  # raised once, by a line after the failure
                f.write(b'{"i": %d}\n' % i)

    emitter = threading.Thread(target=write_five, daemon=True)
    emitter.start()
    emitter.join(30)
    assert not emitter.is_alive(), "a write waited for a writer's thread that had ended"
    f.close()
    assert str(f.error) == "lines.jsonl: cannot write (MemoryError); lines written before are kept"
    assert (tmp_path / "lines.jsonl").read_bytes() == b'{"i": 0}\n'


def test_a_close_interrupted_while_the_writer_writes_leaves_it_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close whose wait for the writer was interrupted (a second Ctrl-C in a program whose SIGINT
    handler raises) gave the writer up: the next close closed the descriptor under the thread still
    writing the queued lines (EBADF, or another file that took the descriptor's number)."""
    from asyncroll.outputs.lines import LineFile

    writes = _GatedWrites(monkeypatch, "lines.jsonl")
    f = LineFile(tmp_path / "lines.jsonl", background=True)
    for i in range(5):
        f.write(b'{"i": %d}\n' % i)
    writer = f._writer
    assert writer is not None
    real_join, interrupted = writer._thread.join, list[bool]()

    def join(timeout: float | None = None) -> None:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        real_join(timeout)

    monkeypatch.setattr(writer._thread, "join", join)
    with pytest.raises(KeyboardInterrupt):
        f.close()
    assert f._fd is not None  # still the writer's
    writes.gate.set()
    f.close()
    assert f.error is None
    assert (tmp_path / "lines.jsonl").read_bytes() == b"".join(b'{"i": %d}\n' % i for i in range(5))
