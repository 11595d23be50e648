"""When the environment's I/O fails under a command: a full disk under a sweep or a replay, a closed
stdout, a server program that cannot even be looked at. Each ends with a clear one-line error naming
the file and the documented exit code: never a traceback, never an error lost.

A full disk is made for real with ``RLIMIT_FSIZE`` in the child (see ``test_disk_full.py``): a file
cannot grow past the limit (``EFBIG``), as a full file system refuses with ``ENOSPC``."""

from __future__ import annotations

import array
import contextlib
import fcntl
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncroll.commands.common import _StderrOrNothing
from tests.conftest import REPO
from tests.experiments import read, write_config

pytestmark = pytest.mark.timeout(60)
SMOKE = REPO / "examples" / "smoke.jsonl"


def asyncroll(
    *args: str | Path,
    limit_bytes: int | None = None,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
) -> subprocess.CompletedProcess[str]:
    """``asyncroll ARGS`` in a new interpreter; files past ``limit_bytes`` cannot grow (a full disk)."""

    def limited() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
        stdout=stdout,
        stderr=stderr,
        text=True,
        timeout=45,
        preexec_fn=limited,
    )


@pytest.mark.parametrize(
    ("limit_bytes", "named"),
    [(3000, "sweep.json"), (300, "workloads/seed-0.jsonl")],  # the tables, then a seed's workload
)
def test_a_sweep_whose_disk_fills_up_names_the_file_without_a_traceback(
    tmp_path: Path, limit_bytes: int, named: str
) -> None:
    # Both were an OSError traceback (the second one twice, chained), exit 1 by accident.
    out = tmp_path / "sweep"
    args = ("simulate", "--sweep", "--workload", SMOKE, "--output", out, "--seeds", "1", "--jobs", "1")
    proc = asyncroll(*args, limit_bytes=limit_bytes)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {out / named}: cannot write (File too large)"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert not list(out.rglob(".*.tmp"))  # no temporary file left behind
    for seeded in (out / "workloads").iterdir():  # no workload cut short that a cell could be run from
        for line in seeded.read_text().splitlines():
            json.loads(line)


def test_a_replay_with_no_room_for_its_workload_names_it_and_leaves_nothing(
    recorded: Path, tmp_path: Path
) -> None:
    # It blamed the recorded run ("--from-run RUN: cannot replay it: OSError: [Errno 27] File too
    # large"), with exit 2, a usage error.
    out = tmp_path / "replay"
    proc = asyncroll("simulate", "--from-run", recorded, "--output", out, limit_bytes=100)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (
        f"error: {out / 'replay-workload.jsonl'}: cannot write (File too large); nothing written, {out} "
        "removed\n"
    )
    assert not out.exists()


def test_a_replay_with_no_room_for_its_receipt_leaves_nothing_behind(recorded: Path, tmp_path: Path) -> None:
    # The replay workload fit, run.json did not: the directory was left holding the replay workload
    # alone, and the same command given again once there was room was refused ("already exists").
    out = tmp_path / "replay"
    size = len(SMOKE.read_bytes())
    proc = asyncroll("simulate", "--from-run", recorded, "--output", out, limit_bytes=2 * size)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith(
        f"error: run failed: run.json: cannot write (File too large); nothing written, {out} removed\n"
    ), proc.stderr
    assert not out.exists()


@contextlib.contextmanager
def failing_stdout(reader: str = "gone") -> Iterator[int]:
    """A descriptor to give a child as its stdout, closed after: ``gone``, the write end of a pipe whose
    reader has gone (``| head -1`` once head has exited; a write fails with EPIPE, Python ignores
    SIGPIPE), or ``/dev/full`` (a file on a full disk: ENOSPC)."""
    if reader == "gone":
        read_end, fd = os.pipe()
        os.close(read_end)
    elif Path(reader).exists():
        fd = os.open(reader, os.O_WRONLY)
    else:
        pytest.skip(f"no {reader} here")
    try:
        yield fd
    finally:
        os.close(fd)


def python_c(script: str, *args: str | Path, stdout: int) -> subprocess.CompletedProcess[str]:
    """``python -c SCRIPT ARGS`` from the repository's root."""
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=45,
        cwd=REPO,
    )


def test_a_reader_gone_from_stdout_silences_the_summary_not_the_runs_error(tmp_path: Path) -> None:
    # `asyncroll simulate … | head -1`, on a full disk: the summary's BrokenPipeError ended the command
    # there, before the run's error reached stderr; the user saw nothing at all.
    out = tmp_path / "run"
    with failing_stdout() as pipe:
        proc = asyncroll("simulate", "--workload", SMOKE, "--output", out, limit_bytes=6000, stdout=pipe)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "error: run failed: events.jsonl: cannot write (File too large)" in proc.stderr, proc.stderr
    assert read(out / "run.json")["status"] == "failed"


@pytest.mark.parametrize("reader", ["gone", "/dev/full"])
def test_a_complete_run_whose_stdout_fails_exits_1_and_stays_complete(tmp_path: Path, reader: str) -> None:
    # > /dev/full (a stdout redirected to a file on a full disk) was an OSError traceback.
    out = tmp_path / "run"
    with failing_stdout(reader) as pipe:
        proc = asyncroll("simulate", "--workload", SMOKE, "--output", out, stdout=pipe)
    assert (proc.returncode, proc.stderr) == (1, "")  # the output it was asked for did not arrive
    receipt = read(out / "run.json")
    assert receipt["status"] == "complete" and receipt["exit_code"] == 0
    assert (out / "summary.json").is_file() and (out / "timeline.html").is_file()


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("validate", "BAD"), 2),  # `asyncroll validate bad.jsonl 2>&1 | head -2`: its errors, then exit 2
        (("schema", "bogus"), 2),
        (("run", "--workload", "BAD", "--output", "OUT"), 2),
        (("simulate", "--workload", str(SMOKE), "--output", "OUT", "--policy", "gpu_first"), 0),  # a warning
    ],
)
def test_a_reader_gone_from_stderr_keeps_the_commands_exit_code(
    tmp_path: Path, args: tuple[str, ...], code: int
) -> None:
    # The first message to a stderr whose reader had gone raised a BrokenPipeError there: the command
    # ended with exit 1 (a usage or validation error read as a failed run), a run where it warned.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 5}\n' * 300)
    out = tmp_path / "run"
    given = [{"BAD": str(bad), "OUT": str(out)}.get(arg, arg) for arg in args]
    with failing_stdout() as pipe:
        proc = asyncroll(*given, stderr=pipe)
    assert proc.returncode == code, proc.stdout
    if args[0] == "simulate":
        assert read(out / "run.json")["status"] == "complete"
        assert proc.stdout.startswith("complete: 3/3 completed")


def test_a_stderr_full_for_now_is_not_taken_for_one_whose_reader_went() -> None:
    """A non-blocking stderr that cannot take more yet (``BlockingIOError``) still has its reader: the
    error is the caller's to see, and stderr is not pointed at /dev/null for the rest of the command."""

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise BlockingIOError(11, "Resource temporarily unavailable")

        def flush(self) -> None:
            raise BlockingIOError(11, "Resource temporarily unavailable")

        def fileno(self) -> int:
            raise AssertionError("silenced: descriptor 2 pointed at /dev/null")

    wrapped = _StderrOrNothing(Full())
    with pytest.raises(BlockingIOError):
        wrapped.write("warning: x\n")
    with pytest.raises(BlockingIOError):
        wrapped.flush()


def test_a_stderr_whose_write_returns_nothing_is_written_to_as_before() -> None:
    # A caller's stand-in for sys.stderr (a duck-typed writer: ``write`` returns None, no encoding): every
    # message the CLI wrote through the wrapper raised a TypeError (``int(None)``) after writing it, and its
    # encoding read as the string 'None', a codec no one has.
    class Plain:
        encoding = None

        def __init__(self) -> None:
            self.parts: list[str] = []

        def write(self, text: str) -> None:
            self.parts.append(text)

        def flush(self) -> None:
            pass

    plain = Plain()
    wrapped = _StderrOrNothing(plain)
    assert wrapped.write("warning: x\n") == len("warning: x\n")
    print("error: y", file=wrapped)  # type: ignore[call-overload]
    assert plain.parts == ["warning: x\n", "error: y", "\n"]
    assert wrapped.encoding is None


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux: /proc/self/fd")
def test_a_failing_stderr_with_no_descriptor_leaks_none() -> None:
    # A stderr with no descriptor of its own (a caller's StringIO-like stand-in) whose writes fail: each
    # failed write opened /dev/null to point descriptor 2 at it, and left it open when fileno() raised.
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    wrapped = _StderrOrNothing(Gone())
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert wrapped.write("warning: x\n") == len("warning: x\n")
    assert len(os.listdir("/proc/self/fd")) == before


#: ``asyncroll experiment run`` with a stand-in for each arm (starting nothing): the runner's own work.
FAKE_ARMS = """
import sys
import asyncroll.experiment.runner as runner
from tests.lean_experiment import fake_arm
runner.run_arm = fake_arm()
from asyncroll.cli import main
sys.argv = ["asyncroll", "experiment", "run", "--config", sys.argv[1], "--output", sys.argv[2]]
main()
"""


#: ``scripts/run_lcb_bounded_single_gpu.py`` with a stand-in for each arm, as ``FAKE_ARMS``.
FAKE_ARMS_SCRIPT = """
import runpy, sys
import asyncroll.experiment.runner as runner
from tests.lean_experiment import fake_arm
runner.run_arm = fake_arm()
config, out = sys.argv[1:3]
sys.argv = ["run_lcb_bounded_single_gpu.py", "--config", config, "--output", out, "--model-path", "sim",
            "--workload", "examples/smoke.jsonl"]
runpy.run_path("scripts/run_lcb_bounded_single_gpu.py", run_name="__main__")
"""


@pytest.mark.parametrize("script", [FAKE_ARMS, FAKE_ARMS_SCRIPT], ids=["experiment run", "single-gpu script"])
def test_an_experiment_whose_reader_has_gone_runs_on(tmp_path: Path, script: str) -> None:
    # `asyncroll experiment run … | tee log`, and tee ends (the terminal closed under nohup): the next
    # progress line's BrokenPipeError failed the experiment ("unexpected error: BrokenPipeError") with
    # arms still to run. The single-GPU script "does what asyncroll experiment run does", but its progress
    # lines were print(): "error: experiment failed: [Errno 32] Broken pipe; --resume continues it once
    # there is room".
    config = write_config(tmp_path, stages={}, pairs=2)
    out = tmp_path / "out"
    with failing_stdout() as pipe:
        proc = python_c(script, config, out, stdout=pipe)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1, proc.stderr  # its stand-in arms failed
    assert proc.stderr.startswith("experiment complete; failed arms kept and reported"), proc.stderr
    experiment = read(out / "experiment.json")
    assert experiment["status"] == "complete" and experiment["error"] is None
    assert {arm["status"] for arm in experiment["arms"].values()} == {"failed"}  # the stand-ins' verdict
    assert len(experiment["arms"]) == 4


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_server_program_that_cannot_be_looked_up_is_a_pre_flight_refusal(
    tmp_path: Path, command: str
) -> None:
    # A folder on the program's way that the user may not search (EACCES; root may search any, so a
    # name too long stands in: ENAMETOOLONG) raised out of the pre-flight check: `run` said "experiment
    # failed: [Errno 36] …; --resume continues it once there is room" (exit 1, nothing to resume),
    # `plan` printed a traceback.
    from tests.conftest import invoke

    program = f"{tmp_path}/{'x' * 300}/serve"
    config = write_config(tmp_path, **{"server.command": [program, "--port", "{port}"]})
    out = tmp_path / "out"
    args: list[str | Path] = ["--config", config]
    if command == "run":
        args += ["--output", out]
    result = invoke("experiment", command, *args)
    said = f"server.command[0]: {program!r} cannot be looked up: File name too long"
    assert said in result.output, result.output
    assert result.exit_code == (2 if command == "run" else 0), result.output
    assert not out.exists()


@pytest.mark.parametrize("reader", ["gone", "/dev/full"])
def test_serve_sim_whose_listening_line_cannot_be_written_says_so(reader: str) -> None:
    # It said "error: cannot listen on 127.0.0.1:0: Broken pipe" (exit 2), blaming the address.
    with failing_stdout(reader) as pipe:
        proc = asyncroll("serve-sim", "--port", "0", stdout=pipe)
    why = "Broken pipe" if reader == "gone" else "No space left on device"
    assert (proc.returncode, proc.stderr) == (1, f"error: stdout: cannot write ({why}); serve-sim stopped\n")


@pytest.mark.parametrize("reader", ["gone", "/dev/full"])
def test_timeline_whose_stdout_fails_still_records_the_new_exports(
    recorded: Path, tmp_path: Path, reader: str
) -> None:
    # `asyncroll timeline RUN > /dev/full` was an OSError traceback, and `… | head -0` once head had
    # exited ended it at its "wrote …" line: both before run.json recorded the exports it had rewritten.
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    (run / "trace.json").unlink()
    with failing_stdout(reader) as pipe:
        proc = asyncroll("timeline", run, stdout=pipe)
    assert (proc.returncode, proc.stderr) == (1, "")  # the line asked for did not arrive
    assert (run / "trace.json").is_file()
    assert read(run / "run.json")["exports_regenerated"]["trace.json"]["ok"] is True


@pytest.mark.parametrize(
    "command",
    [
        ("schema", "summary"),
        ("validate", str(SMOKE)),
        ("--version",),
        ("--help",),  # click printed the help pages itself: the same traceback
        ("run", "--help"),
        ("experiment", "--help"),
        ("experiment", "run", "--help"),
    ],
)
def test_a_command_that_only_prints_to_a_full_disk_exits_1_without_a_traceback(
    command: tuple[str, ...],
) -> None:
    # Each was an OSError traceback (No space left on device).
    with failing_stdout("/dev/full") as full:
        proc = asyncroll(*command, stdout=full)
    assert (proc.returncode, proc.stderr) == (1, "")


def test_a_reader_gone_in_the_middle_of_the_schemas_exits_1() -> None:
    # `asyncroll schema | head -1`: the schemas (≈ 90 kB) fill the pipe, head reads and exits while the
    # write waits for room. The write came back short and TextIOWrapper dropped the rest without an
    # error: the output was cut, and the command exited 0.
    with subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", "schema"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            fd = proc.stdout.fileno()
            capacity = fcntl.fcntl(fd, 1032)  # F_GETPIPE_SZ
            queued = array.array("i", [0])
            while proc.poll() is None:  # until the pipe is full: the writer waits in its write
                fcntl.ioctl(fd, termios.FIONREAD, queued)
                if queued[0] >= capacity:
                    break
                time.sleep(0.01)
            assert proc.poll() is None, "the schemas fit in the pipe: nothing to cut"
            os.read(fd, 5)  # head -1's first read, then head exits
            proc.stdout.close()
            assert proc.wait(timeout=45) == 1
            assert proc.stderr.read() == b""
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", [["schema", "workload"], ["validate", "examples/smoke.jsonl"]])
def test_a_command_started_with_stdout_closed_exits_1(command: list[str]) -> None:
    # `asyncroll schema >&-`: Python starts with no sys.stdout, and click's echo wrote to nothing: exit 0,
    # as if the output asked for had arrived.
    done = subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO,
        preexec_fn=lambda: os.close(1),  # the child alone, before exec: it starts with fd 1 closed
        timeout=45,
    )
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr


def test_an_experiments_warning_reaches_stderr_when_stdout_has_gone(tmp_path: Path) -> None:
    # "stderr still says everything (a run's error, a warning)": the runner's own warning was a progress
    # line on stdout, dropped with the rest of it once the reader had gone.
    config = write_config(tmp_path, stages={}, pairs=1, **{"workload.sha256": None})
    with failing_stdout() as pipe:
        proc = python_c(FAKE_ARMS, config, tmp_path / "out", stdout=pipe)
    assert proc.returncode == 1, proc.stderr  # its stand-in arms failed
    assert proc.stderr.startswith("warning: workload.sha256 not declared; this experiment pins"), proc.stderr


@pytest.mark.parametrize("command", ["convert-livecodebench", "convert-toolmath"])
def test_a_conversion_whose_disk_fills_up_exits_1_not_as_a_usage_error(tmp_path: Path, command: str) -> None:
    # It exited 2, which the CLI documents as a usage error: the same command succeeds once there is room.
    from tests.conversions import LCB_ROW, TM_EXAMPLE, TM_SAMPLE

    out = tmp_path / "converted" / "workload.jsonl"
    source = ("--source", LCB_ROW) if command == "convert-livecodebench" else ("--source", TM_SAMPLE)
    tools = () if command == "convert-livecodebench" else ("--functions-dir", TM_EXAMPLE)
    proc = asyncroll(command, *source, *tools, "--output", out, limit_bytes=100)
    assert (proc.returncode, proc.stderr) == (1, f"error: --output {out}: cannot write: File too large\n")
    assert not (tmp_path / "converted").exists()  # nothing published, the folder it made removed


def test_a_report_whose_disk_fills_up_exits_1_not_as_a_usage_error(tmp_path: Path) -> None:
    # It exited 2 ("cannot write the report" was raised as a usage error), as the conversions did.
    from tests.test_experiment_inputs import comparison

    path = tmp_path / "comparison.json"
    path.write_text(json.dumps(comparison()))
    out = tmp_path / "report"
    proc = asyncroll("report", "--comparison", path, "--output", out, limit_bytes=200)
    assert (proc.returncode, proc.stderr) == (
        1,
        f"error: --output {out}: cannot write the report: File too large\n",
    )
    assert sorted(os.listdir(tmp_path)) == ["comparison.json"]  # no report, no staging folder left
