"""Commands in environments unlike a developer's: a current directory that was removed, a stderr that
was closed, descriptor and process limits, a umask that leaves new directories unwritable. Each ends
with one clear line on stderr and its documented exit code, never a traceback, and leaves no process
and no half-made directory behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from asyncroll.cpus import usable_cpus
from asyncroll.events import parse_event
from tests.conftest import REPO, invoke
from tests.simulations import simulate_here
from tests.unprivileged import as_user, skip_unless_bound

pytestmark = pytest.mark.timeout(90)
SMOKE = REPO / "examples" / "smoke.jsonl"


def asyncroll(
    *args: str | Path,
    cwd: Path | None = None,
    prepare: Callable[[], None] | None = None,
    stderr: int | None = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``asyncroll ARGS`` in a new interpreter, ``prepare`` run in the child before it starts."""
    return subprocess.run(
        [sys.executable, "-m", "asyncroll.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=75,
        cwd=cwd,
        preexec_fn=prepare,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--workload", SMOKE, "--output", "out", "--no-progress"],
        ["simulate", "--workload", SMOKE, "--output", "out"],
        ["simulate", "--sweep", "--workload", SMOKE, "--output", "out", "--seeds", "1", "--jobs", "1"],
    ],
    ids=["run", "simulate", "sweep"],
)
def test_a_command_whose_current_directory_was_removed_says_so(
    tmp_path: Path, command: list[str | Path]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()

    def remove_cwd() -> None:
        os.rmdir(gone)  # the child is in it already: its working directory no longer exists

    done = asyncroll(*command, cwd=gone, prepare=remove_cwd)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "current directory" in done.stderr and "no longer exists" in done.stderr
    assert not gone.exists()  # nothing was made at a path relative to it


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["run", "--help"], "Usage: "),
        (["simulate", "--help"], "Usage: "),
        (["schema", "events"], '"$defs"'),
        (["experiment", "schema"], '"$defs"'),
    ],
    ids=["run-help", "simulate-help", "schema", "experiment-schema"],
)
def test_what_needs_no_current_directory_works_in_one_that_was_removed(
    tmp_path: Path, command: list[str], said: str
) -> None:
    """A command's --help, and a command that takes no path, never use the current directory: the
    removed-directory refusal (meant for the paths a command makes or reads) refused them too."""
    gone = tmp_path / "gone"
    gone.mkdir()
    done = asyncroll(*command, cwd=gone, prepare=lambda: os.rmdir(gone))
    assert done.returncode == 0, done.stderr
    assert said in done.stdout and "no longer exists" not in done.stderr


def test_serve_sim_serves_from_a_current_directory_that_was_removed(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=gone,
        preexec_fn=lambda: os.rmdir(gone),
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()  # the server's first line, or "" once it exited
        assert first.startswith("serve-sim listening on "), server.communicate(timeout=60)
        server.terminate()
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
        server.communicate(timeout=60)


def _close_stderr() -> None:
    os.close(2)  # `2>&-`: Python starts with sys.stderr None


def _stderr_reader_gone() -> None:
    read, write = os.pipe()
    os.dup2(write, 2)  # `2>&1 | head -1` once head has exited: every write to stderr fails with EPIPE
    os.close(read)
    os.close(write)


@pytest.mark.parametrize(
    ("prepare", "progress"),
    [(_close_stderr, []), (_close_stderr, ["--progress"]), (_stderr_reader_gone, ["--progress"])],
    ids=["closed", "closed-progress", "reader-gone-progress"],
)
def test_a_sweep_whose_stderr_is_closed_or_gone_runs_and_writes_its_tables(
    tmp_path: Path, prepare: Callable[[], None], progress: list[str]
) -> None:
    """Its progress line read ``sys.stderr.isatty()`` on None (stderr closed), and a reader gone raised
    BrokenPipeError out of the sweep: each exited 1 with no table written. A run's progress line stops
    drawing instead; so does a sweep's."""
    out = tmp_path / "sweep"
    args: list[str | Path] = ["simulate", "--sweep", "--workload", SMOKE, "--output", out, "--seeds", "2"]
    done = asyncroll(*args, "--jobs", "1", *progress, prepare=prepare, stderr=None)
    assert done.returncode == 0
    assert (out / "sweep.json").is_file() and (out / "sweep.md").is_file()


def _files(limit: int) -> Callable[[], None]:
    def lower() -> None:  # `ulimit -n LIMIT`
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return lower


def test_a_sweep_whose_cell_processes_cannot_start_names_the_limit(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args: list[str | Path] = [
        "simulate",
        "--sweep",
        "--workload",
        SMOKE,
        "--output",
        out,
        "--seeds",
        "2",
        "--jobs",
        "2",
    ]
    done = asyncroll(*args, "--no-progress", prepare=_files(13))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "Too many open files" in done.stderr and "hold 13 open files: ulimit -n" in done.stderr
    assert "--jobs 1" in done.stderr  # the way out: the cells in the sweep's own process
    assert not (out / "sweep.json").exists()
    # the advice holds: the cells in the sweep's own process need no more descriptors
    done = asyncroll(*args[:5], tmp_path / "again", *args[6:-2], "--jobs", "1", prepare=_files(13))
    assert done.returncode == 0, done.stderr


def test_a_run_whose_workers_cannot_start_names_the_limit_and_leaves_no_worker(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args: list[str | Path] = [
        "run",
        "--workload",
        SMOKE,
        "--output",
        out,
        "--cpu-workers",
        "8",
        "--no-progress",
    ]
    done = asyncroll(*args, prepare=_files(32))  # some workers start, then a spawn finds no descriptor
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    # the file that found no descriptor is named where one was (scipy's, when the predictor's import met
    # the limit first: on 3.13 now and then), and the limit after it
    assert "Too many open files" in done.stderr
    assert " (this process may hold 32 open files: ulimit -n)" in done.stderr
    assert "OSError(24" not in done.stderr  # an error's text, not its repr
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and "ulimit -n" in receipt["error"]
    for line in (out / "events.jsonl").read_text().splitlines():
        parse_event(line)  # whole lines only
    pid = str(receipt["pid"])
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "asyncroll.workers.child" in (p.info["cmdline"] or []) and pid in (p.info["cmdline"] or [])
    ]
    assert left == []


@pytest.mark.parametrize("umask", [0o777, 0o277, 0o444], ids=["0777", "0277", "0444"])
@pytest.mark.parametrize("command", ["run", "simulate", "sweep", "replay"])
def test_a_umask_that_leaves_the_output_unwritable_is_refused_and_nothing_left(
    tmp_path: Path, umask: int, command: str, request: pytest.FixtureRequest
) -> None:
    """Bound by file permissions as an ordinary user (root writes in a folder of mode 000):
    ``tests/unprivileged.py``."""
    skip_unless_bound()
    # a run to replay: the module's one simulated run (``recorded``, made in this process), asked for only
    # here (a subprocess per umask was seconds of the suite each); the replay itself runs in its own process
    recorded = request.getfixturevalue("recorded") if command == "replay" else tmp_path / "recorded"
    out = tmp_path / "out"
    commands: dict[str, list[str | Path]] = {
        "run": ["run", "--workload", SMOKE, "--no-progress"],
        "simulate": ["simulate", "--workload", SMOKE],
        "sweep": ["simulate", "--sweep", "--workload", SMOKE, "--seeds", "1", "--jobs", "1"],
        "replay": ["simulate", "--from-run", recorded],
    }

    def set_umask() -> None:
        os.umask(umask)

    done = asyncroll(*commands[command], "--output", out, prepare=as_user(set_umask))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"--output {out}: made with mode {0o777 & ~umask:04o}" in done.stderr and "umask" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("umask", [0o277, 0o444], ids=["0277", "0444"])
@pytest.mark.parametrize("made", [False, True], ids=["new", "empty"])
def test_an_experiment_under_a_umask_that_leaves_its_output_unusable_is_refused_before_any_arm(
    tmp_path: Path, umask: int, made: bool
) -> None:
    """Under umask 0277 the runner failed on its own lock ('cannot open the runner's lock: Permission
    denied'), leaving the folder; under 0444 it started each arm's server and every client refused its
    run folder, the first stage failing its gate as if that were a result. An empty --output made
    beforehand (an experiment's is allowed) escaped the check of a new one, its experiment.json left
    unreadable (0222): it is checked before the lock, on a folder made in it as an arm's will be, and
    nothing is left in it. Bound by file permissions as an ordinary user."""
    skip_unless_bound()
    out = tmp_path / "out"
    if made:
        out.mkdir()
    config = REPO / "experiments" / "serve_sim_smoke.json"

    def set_umask() -> None:
        os.umask(umask)

    done = asyncroll("experiment", "run", "--config", config, "--output", out, prepare=as_user(set_umask))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "starting" not in done.stderr
    mode = f"{0o777 & ~umask:04o} (the umask's)"
    said = f"a folder made in it gets mode {mode}" if made else f"made with mode {mode}"
    assert f"--output {out}: {said}" in done.stderr
    assert (list(out.iterdir()) == []) if made else not out.exists()


def _one_process() -> None:  # `ulimit -u 1`: this process only, no thread nor child more
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))


#: OpenBLAS that cannot start its threads raises SIGINT in the process (docs/RUNNING.md: it reads
# "interrupted by
#: SIGINT"); one BLAS thread starts none, so the limit is met by asyncroll's own threads and processes.
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1"}
NEEDS_A_USER = pytest.mark.skipif(
    os.geteuid() == 0, reason="RLIMIT_NPROC does not bind root: needs a non-root user"
)


@NEEDS_A_USER
def test_a_run_that_can_start_no_thread_nor_worker_names_the_process_limit(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = asyncroll(
        "run",
        "--workload",
        SMOKE,
        "--output",
        out,
        "--no-progress",
        prepare=_one_process,
        env=ONE_BLAS_THREAD,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed"
    for part in receipt["error"].split("; "):  # a thread and a worker may each have failed
        assert part.endswith("(this user may run 1 processes and threads: ulimit -u)"), part
    assert receipt["error"] in done.stderr


def _process_limit(n: int) -> type:
    """``resource`` as the product reads it under ``ulimit -u n`` (which does not bind root)."""

    class Limited:
        RLIMIT_NPROC = resource.RLIMIT_NPROC
        RLIM_INFINITY = resource.RLIM_INFINITY

        @staticmethod
        def getrlimit(which: int) -> tuple[int, int]:
            return (n, n) if which == resource.RLIMIT_NPROC else resource.getrlimit(which)

    return Limited


def test_a_results_writer_thread_that_cannot_start_fails_the_run_in_its_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above, as root too (whom ``ulimit -u`` does not bind): results.jsonl's writer thread is
    refused. It was a traceback from ``RunDirectory``, run.json left saying "preparing"."""
    import threading

    from asyncroll import process_limits
    from asyncroll.clock import SystemClock
    from asyncroll.errors import OutputWriteError
    from asyncroll.outputs.rundir import open_run_files

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(process_limits, "resource", _process_limit(1))
    monkeypatch.setattr(threading.Thread, "start", refused)
    out = tmp_path / "run"
    out.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    said = "results.jsonl: cannot start its writer thread (can't start new thread)"
    with pytest.raises(OutputWriteError) as raised:
        open_run_files(out, {"config": {}}, SystemClock())
    assert str(raised.value) == f"{said} (this user may run 1 processes and threads: ulimit -u)"
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and receipt["exit_code"] == 1
    assert receipt["error"] == str(raised.value)
    assert len(os.listdir("/proc/self/fd")) == before  # results.jsonl and the directory closed again


def test_an_event_log_writer_thread_that_cannot_start_fails_the_run_in_its_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results writer started, the last thread the limit let start; events.jsonl's writer is refused.
    It was a RuntimeError traceback from ``open_run_files``, run.json left saying "preparing" and
    results.jsonl's writer running."""
    import threading

    from asyncroll import process_limits
    from asyncroll.clock import SystemClock
    from asyncroll.errors import OutputWriteError
    from asyncroll.outputs.rundir import open_run_files

    start = threading.Thread.start

    def refused_for_events(self: threading.Thread) -> None:
        if "events.jsonl" in self.name:
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(process_limits, "resource", _process_limit(2))
    monkeypatch.setattr(threading.Thread, "start", refused_for_events)
    out = tmp_path / "run"
    out.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OutputWriteError) as raised:
        open_run_files(out, {"config": {}}, SystemClock())
    said = "events.jsonl: cannot start its writer thread (can't start new thread)"
    assert str(raised.value) == f"{said} (this user may run 2 processes and threads: ulimit -u)"
    receipt = json.loads((out / "run.json").read_text())
    assert receipt["status"] == "failed" and receipt["exit_code"] == 1
    assert receipt["error"] == str(raised.value)
    assert len(os.listdir("/proc/self/fd")) == before  # events.jsonl, results.jsonl, the directory closed
    assert not [t for t in threading.enumerate() if "results.jsonl" in t.name]  # its writer ended


@NEEDS_A_USER
def test_a_sweep_that_can_start_no_cell_process_names_the_process_limit(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args: list[str | Path] = ["simulate", "--sweep", "--workload", SMOKE, "--output", out, "--seeds", "2"]
    done = asyncroll(*args, "--jobs", "2", prepare=_one_process, env=ONE_BLAS_THREAD)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "cannot start the sweep's cell processes (--jobs 2)" in done.stderr
    assert "(this user may run 1 processes and threads: ulimit -u); --jobs 1 runs" in done.stderr


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or usable_cpus() < 2,
    reason="semaphores live in /dev/shm on Linux; --jobs is lowered to the usable CPUs: needs 2",
)
def test_a_sweep_that_can_make_no_semaphore_names_dev_shm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container or sandbox whose /dev/shm is read-only or absent: the cell pool's semaphores cannot be
    made there (sem_open's OSError names no file). The error read 'cannot start the sweep's cell processes
    (--jobs 2): Read-only file system' (or 'No such file or directory'), naming no path."""
    import _multiprocessing

    class NoShm:
        SEM_VALUE_MAX = _multiprocessing.SemLock.SEM_VALUE_MAX

        def __init__(self, *args: object, **kwargs: object) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(_multiprocessing, "SemLock", NoShm)
    out = tmp_path / "sweep"
    done = simulate_here("--sweep", "--workload", SMOKE, "--output", out, "--jobs", "2", "--no-progress")
    assert done.exit_code == 1, done.stderr
    assert (
        "cannot start the sweep's cell processes (--jobs 2): cannot make a semaphore in /dev/shm: "
        "Read-only file system; --jobs 1 runs the cells in this process" in done.stderr
    ), done.stderr


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_run_json_says_how_many_cpus_the_run_could_use(tmp_path: Path) -> None:
    """Under ``taskset -c 0`` (or a container's cpuset) run.json's host said only ``cpu_count``, the
    machine's: a run limited to one CPU read as one on all of them."""
    done = asyncroll(
        "simulate",
        "--workload",
        SMOKE,
        "--output",
        tmp_path / "out",
        prepare=lambda: os.sched_setaffinity(0, {0}),
    )
    assert done.returncode == 0, done.stderr
    host = json.loads((tmp_path / "out" / "run.json").read_text())["host"]
    assert host["usable_cpus"] == 1 and host["cpu_count"] == os.cpu_count()


@pytest.mark.timeout(30)
def test_an_allocation_a_low_address_space_limit_refuses_names_the_limit() -> None:
    """Under ``ulimit -v`` a run failed with "MemoryError" or "ImportError: …so: failed to map segment
    from shared object" (a compiled module's import), nothing saying which limit to raise."""
    if resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY:
        pytest.skip("this process's address space has a hard limit already")
    script = (
        "import errno, resource\n"
        "from asyncroll.process_limits import limit_note\n"
        "resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "print(repr(limit_note(MemoryError())))  # no limit: the machine's memory ran out\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
        "for exc in (MemoryError(), OSError(errno.ENOMEM, 'Cannot allocate memory'),\n"
        "            ImportError('x.so: failed to map segment from shared object'), ImportError('no x')):\n"
        "    print(repr(limit_note(exc)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    said = " (this process may use 3,072 MiB of address space: ulimit -v)"
    assert done.stdout.splitlines() == ["''", repr(said), repr(said), repr(said), "''"]


def _address_space(limit: int) -> Callable[[], None]:
    def prepare() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    return prepare


@pytest.mark.timeout(120)
def test_a_run_under_a_low_address_space_limit_says_so_before_it_starts(tmp_path: Path) -> None:
    """Under ``ulimit -v 400000`` a run hung in its start-up for good (OpenBLAS retrying an allocation
    the limit refused, deaf to SIGTERM), nothing said; ``run`` and ``simulate`` warn first. (1.5 GiB, at
    which both still work, is tested here: the hang itself would need SIGKILL.)"""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY and hard < 2 << 30:
        pytest.skip("this process's address space has a low hard limit already")
    said = "warning: this process may use 1,536 MiB of address space (ulimit -v): "
    for command in (["run", "--cpu-workers", "1"], ["simulate"]):
        out = tmp_path / command[0]
        args: list[str | Path] = [*command, "--workload", SMOKE, "--output", out, "--no-progress"]
        done = asyncroll(*args, prepare=_address_space(1536 << 20), env={"OPENBLAS_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith(said) and "only SIGKILL stops it" in done.stderr, done.stderr
        # without the limit (this process's, which set none), nothing said: in this process, as the limit
        # that is read is the process's own (a new interpreter per command was seconds each)
        free = invoke(*args[:-3], "--output", tmp_path / f"{command[0]}-free", "--no-progress")
        assert free.exit_code == 0 and "ulimit -v" not in free.stderr, free.output


def _open_files(soft: int, hard: int) -> Callable[[], None]:
    def prepare() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return prepare


@pytest.mark.timeout(60)
def test_open_files_for_many_requests_in_flight_are_raised_to_the_hard_limit_or_warned_about() -> None:
    """Under ``ulimit -n 1024`` a run with 1,024 requests in flight had those past it fail mid-run as
    transport errors ('Too many open files'), the circuit opening as if the server were down (31 of 2,000
    trajectories failed against serve-sim); the soft limit is raised as far as the hard limit allows, and
    a hard limit too low for the requests is said before the run starts."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("this process's open-files hard limit is below 1024 already")
    code = (
        "import resource; from asyncroll.process_limits import open_files_for; "
        "print(repr(open_files_for(600, 2))); print(resource.getrlimit(resource.RLIMIT_NOFILE)); "
        "print(repr(open_files_for(2000, 2))); print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    low = _open_files(200, 1024)
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, preexec_fn=low)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["None", "(676, 1024)"]  # 600 connections, 2 workers' 12 files, 64 besides
    assert lines[3] == "(1024, 1024)"
    assert "2000 model requests in flight and 2 worker(s) need about 2076 open files" in lines[2]
    assert "may hold 1024 (ulimit -n, its hard limit 1024)" in lines[2]


@pytest.mark.timeout(60)
def test_serve_sim_raises_its_open_files_limit_as_vllm_does() -> None:
    """serve-sim takes a connection per request its clients have in flight: under ``ulimit -n 200`` (hard
    limit 1024) a client with more in flight ran it out of descriptors. It raises its soft limit as far as
    the hard limit allows (vLLM's server raises its own to 65,535), never past it."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("this process's open-files hard limit is below 1024 already")
    server = subprocess.Popen(
        [sys.executable, "-m", "asyncroll.cli", "serve-sim", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_open_files(200, 1024),
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith("serve-sim listening on "), server.communicate(timeout=60)
        limits = Path(f"/proc/{server.pid}/limits").read_text().splitlines()
        [files] = [line.split()[3:5] for line in limits if line.startswith("Max open files")]
        assert files == ["1024", "1024"]  # soft raised from 200 to the hard limit
        server.terminate()
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
        server.communicate(timeout=60)


@pytest.mark.timeout(120)
def test_a_run_with_more_requests_in_flight_than_open_files_says_so_before_it_starts(tmp_path: Path) -> None:
    args: list[str | Path] = [
        "run",
        "--backend",
        "openai",
        "--model",
        "m",
        "--endpoint",
        "http://127.0.0.1:9",
    ]
    args += [
        "--workload",
        SMOKE,
        "--cpu-workers",
        "1",
        "--no-progress",
        "--max-inflight-model-requests",
        "2000",
    ]
    warning = "warning: 2000 model requests in flight and 1 worker(s) need about 2070 open files"
    low: list[str | Path] = ["--max-active-trajectories", "2000", "--output", tmp_path / "low"]
    done = asyncroll(*args, *low, prepare=_open_files(200, 1024))
    assert warning in done.stderr, done.stderr
    # 600 active trajectories have at most 600 requests in flight: room for them is made, nothing said
    # (2000 asked for were warned about, though no more than 600 could ever be in flight)
    raised: list[str | Path] = ["--max-active-trajectories", "600", "--output", tmp_path / "raised"]
    done = asyncroll(*args, *raised, prepare=_open_files(200, 1024))
    assert "open files" not in done.stderr, done.stderr


@pytest.mark.timeout(120)
def test_a_scripted_run_raises_its_open_files_for_its_workers(tmp_path: Path) -> None:
    """A scripted run's workers need pipes too: 8 workers under a soft ``ulimit -n 24`` (hard limit 1024)
    could not start ('Too many open files') although the hard limit had room; the soft limit is raised
    for them now, and a hard limit too low is said before the run starts."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("this process's open-files hard limit is below 1024 already")
    args: list[str | Path] = ["run", "--workload", SMOKE, "--cpu-workers", "8", "--no-progress"]
    done = asyncroll(*args, "--output", tmp_path / "raised", prepare=_open_files(24, 1024))
    assert done.returncode == 0 and "open files" not in done.stderr, done.stderr
    done = asyncroll(*args, "--output", tmp_path / "low", prepare=_open_files(24, 24))
    assert "warning: 8 worker(s) need about 64 open files, but this process may hold 24" in done.stderr
    assert done.returncode != 0, done.stderr  # as before: a worker that cannot start fails the run


@pytest.mark.timeout(120)
def test_a_scripted_run_that_fits_its_open_files_is_not_warned_about(tmp_path: Path) -> None:
    """docs/RUNNING.md's measured case: 2 workers start under ``ulimit -n 32``. The warning counted 64
    files besides
    the workers' (a run against a server's), so a scripted run that fits was told 'workers past it cannot
    start' (2 workers under 32, 8 under 64), and then completed."""
    args: list[str | Path] = ["run", "--workload", SMOKE, "--no-progress", "--cpu-workers"]
    for workers, files in ((2, 32), (8, 64)):
        done = asyncroll(
            *args, str(workers), "--output", tmp_path / str(workers), prepare=_open_files(files, files)
        )
        assert done.returncode == 0 and "open files" not in done.stderr, done.stderr


@pytest.mark.timeout(120)
def test_a_scripted_run_of_many_workers_raises_its_open_files_enough_for_them(tmp_path: Path) -> None:
    """Each worker holds about 5 files (its pipes and process handle); the raise counted 4 a worker, so 64
    workers under a soft 24 (hard 4096) were given 320 and worker 60 or so could not spawn: 'this process
    may hold 320 open files: ulimit -n', a limit nobody had set, with no warning before the run."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096:
        pytest.skip("this process's open-files hard limit is below 4096 already")
    args: list[str | Path] = ["run", "--workload", SMOKE, "--cpu-workers", "64", "--no-progress"]
    done = asyncroll(*args, "--output", tmp_path / "run", prepare=_open_files(24, 4096))
    assert done.returncode == 0, done.stderr


def test_the_limit_notes_warnings_and_raises_under_each_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """process_limits against a stand-in for ``resource`` (any limit, root or not, a raise refused): an
    unlimited soft limit is no limit to name (a process limit) or is named 'unlimited' (open files); a
    raise refused leaves the soft limit in force and says so; an unlimited hard limit is no ceiling."""
    from types import SimpleNamespace

    from asyncroll import process_limits
    from asyncroll.process_limits import (
        address_space_warning,
        limit_note,
        open_files_for,
        open_files_for_server,
    )

    unlimited = -1
    limits: dict[int, tuple[int, int]] = {}
    refused: list[str] = []

    def setrlimit(which: int, value: tuple[int, int]) -> None:
        if refused:
            raise ValueError("not allowed to raise the limit")
        limits[which] = value

    fake = SimpleNamespace(
        RLIMIT_NOFILE=1,
        RLIMIT_NPROC=2,
        RLIMIT_AS=3,
        RLIM_INFINITY=unlimited,
        getrlimit=lambda which: limits[which],
        setrlimit=setrlimit,
    )
    monkeypatch.setattr(process_limits, "resource", fake)
    limits |= {fake.RLIMIT_NOFILE: (16, 1024), fake.RLIMIT_NPROC: (1, unlimited)}
    said = " (this user may run 1 processes and threads: ulimit -u)"
    assert limit_note(OSError(errno.EAGAIN, "Resource temporarily unavailable")) == said
    assert limit_note(RuntimeError("can't start new thread")) == said
    assert limit_note(RuntimeError("another error")) == limit_note(OSError(errno.EPERM, "no")) == ""
    assert limit_note(OSError(errno.EMFILE, "Too many open files")).startswith(" (this process may hold 16 ")
    limits |= {fake.RLIMIT_NOFILE: (unlimited, unlimited), fake.RLIMIT_NPROC: (unlimited, unlimited)}
    assert limit_note(OSError(errno.EAGAIN, "Resource temporarily unavailable")) == ""  # the kernel's
    assert limit_note(OSError(errno.EMFILE, "Too many open files")).startswith(" (this process may hold unl")
    # ulimit -v: warned below 2 GiB only
    limits[fake.RLIMIT_AS] = (2 << 30, unlimited)
    assert address_space_warning() is None
    limits[fake.RLIMIT_AS] = ((2 << 30) - (1 << 20), unlimited)
    assert (address_space_warning() or "").startswith("warning: this process may use 2,047 MiB")
    # open files: raised as far as needed under an unlimited hard limit, refused: the soft limit said
    limits[fake.RLIMIT_NOFILE] = (unlimited, unlimited)
    assert open_files_for(600, 2) is None and limits[fake.RLIMIT_NOFILE] == (unlimited, unlimited)
    limits[fake.RLIMIT_NOFILE] = (100, unlimited)
    assert open_files_for(600, 2) is None and limits[fake.RLIMIT_NOFILE] == (676, unlimited)
    assert open_files_for_server() == 65535 and limits[fake.RLIMIT_NOFILE] == (65535, unlimited)
    refused.append("yes")
    limits[fake.RLIMIT_NOFILE] = (100, unlimited)
    warned = open_files_for(600, 2) or ""
    assert "may hold 100 (ulimit -n, its hard limit unlimited)" in warned, warned
    limits[fake.RLIMIT_NOFILE] = (100, 1024)
    assert "may hold 100 (ulimit -n, its hard limit 1024)" in (open_files_for(0, 20) or "")
    assert open_files_for_server() == 100 and limits[fake.RLIMIT_NOFILE] == (100, 1024)
    refused.clear()
    assert open_files_for_server() == 1024 and limits[fake.RLIMIT_NOFILE] == (1024, 1024)
    limits[fake.RLIMIT_NOFILE] = (70000, 80000)  # never lowered
    assert open_files_for_server() == 70000 and limits[fake.RLIMIT_NOFILE] == (70000, 80000)
    limits[fake.RLIMIT_NOFILE] = (unlimited, unlimited)
    assert open_files_for_server() == unlimited and limits[fake.RLIMIT_NOFILE] == (unlimited, unlimited)


@pytest.mark.parametrize("entry", ["asyncroll", "asyncroll.cli"])
def test_a_run_started_without_stderr_holds_descriptor_2_on_dev_null(tmp_path: Path, entry: str) -> None:
    """Started with ``2>&-``, the process handed descriptor 2 to the next file it opened — the event loop's
    epoll handle in a run (QA), and an output file, a pipe or a socket could take it as well, where a
    signal handler's ``os.write(2, …)`` or a child inheriting it would write. ``/dev/null`` holds it from
    the command's first instant, through both entry points."""
    from tests.conftest import tool_problem, write_workload

    workload = write_workload(tmp_path / "w.jsonl", [tool_problem("p", model_ms=10, cpu_ms=2500)])
    out = tmp_path / "run"
    args = ["run", "--workload", str(workload), "--output", str(out), "--no-progress", "--policy", "fifo"]
    child = subprocess.Popen(
        [sys.executable, "-m", entry, *args], stdout=subprocess.PIPE, text=True, preexec_fn=_close_stderr
    )
    try:
        held: str | None = None
        deadline = time.monotonic() + 60
        while held is None and child.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):  # not written yet, or being replaced
                if json.loads((out / "run.json").read_text())["status"] == "running":
                    held = os.readlink(f"/proc/{child.pid}/fd/2")
            time.sleep(0.02)
        assert held == os.devnull, held
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_no_dev_null_to_hold_a_closed_descriptor_leaves_it_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a bare chroot without /dev/null, holding a closed standard descriptor raised at the command's
    start (a traceback before anything ran); it is left closed, as the command was started."""
    import types

    from asyncroll import std_fds

    def closed(fd: int) -> os.stat_result:
        raise OSError(errno.EBADF, "Bad file descriptor")

    def no_dev_null(path: str, flags: int) -> int:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)

    fake = types.SimpleNamespace(fstat=closed, open=no_dev_null, devnull=os.devnull, O_RDWR=os.O_RDWR)
    monkeypatch.setattr(std_fds, "os", fake)
    std_fds.hold_standard_fds()  # no exception
