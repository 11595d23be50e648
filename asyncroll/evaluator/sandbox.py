"""Run one untrusted program on one test input in a sandboxed child, and leave nothing running after.

Per test the sandbox starts ``[unshare --pid --fork --kill-child --mount-proc [--net] [--ipc] --] python
-I -c <harness> <config>`` (see :mod:`asyncroll.evaluator.harness`) with:

* an explicit allow-listed environment (``PATH``, ``LANG``, ``LC_ALL``, ``HOME``, ``TMPDIR``): never the
  runtime's, which may carry secrets and ``PYTHONUNBUFFERED=1`` (a variable that can change a verdict);
* a new session (own process group), ``PR_SET_PDEATHSIG`` so it dies with the worker, rlimits (address
  space, CPU seconds, file size, open files, processes, no core files), and membership of a fresh
  per-test ``memory`` + ``pids`` cgroup (v1, or v2 where the host has no v1 hierarchy for them), all
  set between ``fork`` and ``exec``;
* the harness building a private root (tmpfs, read-only system directories; see the harness) and
  dropping to the unprivileged uid (``nobody``) when the worker is root — rlimits do not bind root, so
  the uid switch is what makes them real — then re-arming its death signal (the uid change cleared
  it) and checking a lifeline pipe only the worker holds, so it cannot outlive a killed worker;
* stdin from a file, stdout/stderr, the program's done record and the harness's exit record on pipes
  read with a deadline (``selectors`` plus a pidfd for the exit), never a blocking read that waits for
  an end of file a descendant could withhold.

After every test — passed, failed, timed out or over the output cap — the *whole* tree is killed: the
program's processes first, reaped by the harness (so their CPU time reaches the worker's account), then
the PID namespace dies with its init (the harness), every member of the cgroup gets SIGKILL until the group
is empty, and a psutil sweep kills the launcher's descendants and any orphan that was re-parented to
the worker (the worker is a child subreaper while it evaluates). If something survives all of that
within the clean-up deadline, :class:`SandboxError` is raised rather than carrying on silently.

The pre-exec hook (:mod:`~.preexec`) runs Python between ``fork`` and ``exec``; that is safe here
because tool workers are single-threaded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from asyncroll.errors import AsyncrollError
from asyncroll.evaluator.cgroups import CgroupFactory, TestGroup
from asyncroll.evaluator.cgroups_v2 import CgroupV2Factory
from asyncroll.evaluator.execution import Execution
from asyncroll.evaluator.preexec import PreExec, tasks_of
from asyncroll.proctree import all_gone, children, is_subreaper, set_subreaper

MiB = 1 << 20
HARNESS_SOURCE = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
CLEANUP_S = 5.0
_READ_CHUNK = 1 << 16
_EXIT_RECORD_CAP = 4096  # {"kind": "exit", "status": N} and room to spare
#: A stdin program's done record: an error of 4,000 characters, each up to 12 bytes as JSON (a functional
#: one's holds the result: twice the stdout cap). The program can write the line itself: 16 MiB of ints
#: took the worker seconds to parse, and up to 256 MiB where a large expected output raised the cap.
STDIN_RECORD_CAP = 64 * 1024
_RUNS = itertools.count(1)  # process-wide: file names in a scratch directory never collide


class SandboxError(AsyncrollError):
    """The sandbox could not start a test or could not clean up after one (a process survived)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-test resource limits. Sizes in bytes, times in seconds."""

    time_limit_s: float = 6.0
    address_space_bytes: int = 768 * MiB
    file_size_bytes: int = 16 * MiB
    open_files: int = 64
    processes: int = 64
    output_bytes: int = 8 * MiB
    stderr_bytes: int = 64 * 1024
    tmpfs_bytes: int = 64 * MiB
    #: ``RLIMIT_NPROC`` counts every process of the sandbox uid on the host, so with a per-test ``pids``
    #: cgroup it is only an aggregate back-stop set this many times higher (concurrent tests on other
    #: workers must not run out of processes because one of them forks a bomb).
    nproc_headroom: int = 16

    @property
    def memory_bytes(self) -> int:
        """The cgroup memory cap of a whole test: one process's address space, the private tmpfs (its
        files are memory) and 64 MiB for the harness and launcher. A single process meets its
        ``RLIMIT_AS`` first (a clean ``MemoryError``, as in LiveCodeBench); the cap binds a tree."""
        return self.address_space_bytes + self.tmpfs_bytes + 64 * MiB

    def __post_init__(self) -> None:
        for name in ("time_limit_s", "address_space_bytes", "file_size_bytes", "open_files", "processes"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"sandbox limit {name} must be a positive number, got {value!r}")
        if self.open_files < 16:
            raise ValueError(f"sandbox limit open_files must be at least 16, got {self.open_files}")
        if self.address_space_bytes < 64 * MiB:
            raise ValueError("sandbox limit address_space_bytes must be at least 64 MiB")


@dataclass(frozen=True, slots=True)
class Layers:
    """Which isolation layers a :class:`Sandbox` uses (decided once by :mod:`~.isolation`)."""

    python: str
    uid: int | None = None
    gid: int | None = None
    pid_namespace: bool = False
    net_namespace: bool = False
    ipc_namespace: bool = False
    private_root: bool = False
    memory_cgroup: Path | None = None  # cgroup v1: the hierarchy directory test groups go under
    pids_cgroup: Path | None = None
    cgroup_v2: Path | None = None  # cgroup v2: the prepared domain (see cgroups_v2.prepare) ...
    cgroup_v2_controllers: tuple[str, ...] = ()  # ... and the controllers enabled there
    unshare: str = "unshare"

    @property
    def cgroup_version(self) -> int | None:
        """The cgroup version per-test groups use, or ``None`` when there are none."""
        if self.cgroup_v2 is not None:
            return 2
        return 1 if self.memory_cgroup is not None or self.pids_cgroup is not None else None


def _read(selector: selectors.BaseSelector, fd: int, buffer: bytearray, cap: int | None) -> int:
    """Append what ``fd`` has to ``buffer`` (up to ``cap`` bytes); unregister it at end of file. Returns
    the buffer's length before (where what this read kept, if anything, begins)."""
    before = len(buffer)
    try:
        chunk = os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return before
    if not chunk:
        selector.unregister(fd)
    elif cap is None or before < cap:
        buffer += chunk
    return before


class Sandbox:
    """Runs programs test by test under :class:`Layers` and :class:`Limits`; one per worker process."""

    def __init__(self, layers: Layers, limits: Limits | None = None) -> None:
        self.layers = layers
        self.limits = limits or Limits()
        self._cgroups: CgroupFactory | CgroupV2Factory | None = None
        if layers.cgroup_v2 is not None:
            self._cgroups = CgroupV2Factory(layers.cgroup_v2, layers.cgroup_v2_controllers)
        elif layers.cgroup_version == 1:
            self._cgroups = CgroupFactory(layers.memory_cgroup, layers.pids_cgroup)
        self._env_home = "/tmp/work" if layers.private_root else None
        self._baseline: set[int] = set()

    def command(self, config: dict[str, object]) -> list[str]:
        prefix: list[str] = []
        namespaces = [
            flag
            for flag, used in (("--net", self.layers.net_namespace), ("--ipc", self.layers.ipc_namespace))
            if used
        ]
        if self.layers.pid_namespace:
            prefix = [
                self.layers.unshare,
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                *namespaces,
                "--",
            ]
        elif namespaces:
            prefix = [self.layers.unshare, *namespaces, "--"]
        return [*prefix, self.layers.python, "-I", "-c", HARNESS_SOURCE, json.dumps(config)]

    def run(
        self,
        code_path: Path,
        stdin_bytes: bytes,
        scratch: Path,
        *,
        func_name: str | None = None,
        wall_s: float | None = None,
        limits: Limits | None = None,
    ) -> Execution:
        """Run the program at ``code_path`` on ``stdin_bytes`` within ``wall_s`` (default: the time
        limit); ``scratch`` is this evaluation's private directory. Always returns with nothing left
        running, or raises :class:`SandboxError`."""
        limits = limits or self.limits
        wall = limits.time_limit_s if wall_s is None else wall_s
        run = next(_RUNS)
        input_path = scratch / f"input-{run}"
        with open(os.open(input_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as hidden:
            hidden.write(stdin_bytes)  # 0600: this worker opens it as stdin; nobody else reads a test
        work = self._work_dir(scratch, run)
        group = self._cgroups.create(limits.memory_bytes, limits.processes) if self._cgroups else None
        status_r, status_w = os.pipe()  # the program's done record
        exit_r, exit_w = os.pipe()  # the harness's exit record (the program's process closes it)
        lifeline_r, lifeline_w = os.pipe()  # held by this worker only; end of file = the worker is gone
        os.set_inheritable(lifeline_w, False)
        config: dict[str, object] = {
            "status_fd": status_w,
            "exit_fd": exit_w,
            "lifeline_fd": lifeline_r,
            "code_path": str(code_path),
            "func_name": func_name,
            "uid": self.layers.uid,
            "gid": self.layers.gid,
            "private_root": self.layers.private_root,
            "tmpfs_bytes": limits.tmpfs_bytes,
        }
        result = Execution()
        self._baseline = children()
        was_subreaper = is_subreaper()  # a tool worker stays one for its whole life
        set_subreaper(True)
        proc: subprocess.Popen[bytes] | None = None
        try:
            try:
                with open(input_path, "rb") as stdin:
                    proc = subprocess.Popen(
                        self.command(config),
                        stdin=stdin,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        pass_fds=(status_w, exit_w, lifeline_r),
                        cwd=work,
                        env=self._environment(work),
                        start_new_session=True,
                        preexec_fn=PreExec(limits, group, self._tasks_in_use()),
                    )
            except OSError as exc:
                if group is not None:
                    group.remove(time.monotonic() + CLEANUP_S)
                raise SandboxError(f"could not start the sandboxed program: {exc}") from exc
            finally:
                os.close(status_w)
                os.close(exit_w)
                os.close(lifeline_r)
            started = time.monotonic()
            cap = 2 * limits.output_bytes if func_name else STDIN_RECORD_CAP
            self._collect(proc, group, (status_r, cap), exit_r, started + wall, limits, result)
            result.wall_s = time.monotonic() - started
        finally:
            try:
                if proc is not None:
                    self._clean_up(proc, group, result)
            finally:
                if not was_subreaper:
                    set_subreaper(False)
                os.close(status_r)
                os.close(exit_r)
                os.close(lifeline_w)
        return result

    def _tasks_in_use(self) -> int:
        """The tasks a program that runs as this process's user (no uid switch) starts with: its
        ``RLIMIT_NPROC`` counts all of them. A program switched to ``nobody`` starts with none."""
        return tasks_of(os.getuid()) if self.layers.uid is None else 0

    def _work_dir(self, scratch: Path, index: int) -> Path:
        if self.layers.private_root:
            return scratch  # the harness works in a private tmpfs; scratch stays root-only
        work = scratch / f"work-{index}"
        work.mkdir(mode=0o700)
        if self.layers.uid is not None and self.layers.gid is not None:
            os.chown(work, self.layers.uid, self.layers.gid)
        return work

    def _environment(self, work: Path) -> dict[str, str]:
        home = self._env_home or str(work)
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": home,
            "TMPDIR": home,
            # glibc reserves 64 MiB of address space for each thread's malloc arena: under the 768 MiB
            # address-space limit a program could start 13 threads, a pool of 20 failing here and not in
            # LiveCodeBench (no memory limit); two arenas leave the threads' stacks as the bound (≈ 85)
            "MALLOC_ARENA_MAX": "2",
        }

    def _collect(
        self,
        proc: subprocess.Popen[bytes],
        group: TestGroup | None,
        status_pipe: tuple[int, int],
        exit_r: int,
        deadline: float,
        limits: Limits,
        out: Execution,
    ) -> None:
        """Read the four pipes until the launcher exits, the deadline passes or stdout overflows; then
        kill the whole tree and drain what the pipes still hold (bounded in time and size).

        Only the first line of the status pipe (``status_pipe``: its fd and cap) is kept (the done record:
        a functional result may be as large as the output cap, twice over as JSON), and of the exit pipe
        only a record's worth: the program can write to the status pipe, and whatever it writes after its
        first line is read and dropped, never stored or parsed."""
        assert proc.stdout is not None and proc.stderr is not None
        status_r, record_cap = status_pipe
        stdout, stderr, status, exit_record = bytearray(), bytearray(), bytearray(), bytearray()
        buffers = {
            proc.stdout.fileno(): stdout,
            proc.stderr.fileno(): stderr,
            status_r: status,
            exit_r: exit_record,
        }
        caps: dict[int, int | None] = {
            proc.stdout.fileno(): None,
            proc.stderr.fileno(): None,
            status_r: record_cap,
            exit_r: _EXIT_RECORD_CAP,
        }
        pidfd = os.pidfd_open(proc.pid)
        try:
            with selectors.DefaultSelector() as selector:
                for fd in buffers:
                    os.set_blocking(fd, False)
                    selector.register(fd, selectors.EVENT_READ)
                selector.register(pidfd, selectors.EVENT_READ)
                exited = False
                while not exited:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        out.timed_out = True
                        break
                    for key, _ in selector.select(remaining):
                        if key.fd == pidfd:
                            exited = True
                        else:
                            before = _read(selector, key.fd, buffers[key.fd], caps[key.fd])
                            if key.fd == status_r:
                                _first_line_only(status, caps, status_r, before)
                    if len(stdout) > limits.output_bytes:
                        out.output_exceeded = True
                        break
                    if len(stderr) > 2 * limits.stderr_bytes:
                        del stderr[: len(stderr) - limits.stderr_bytes]
                selector.unregister(pidfd)
                self._kill_everything(proc, group)
                drain_until = time.monotonic() + 1.0
                while selector.get_map() and not out.output_exceeded:
                    remaining = drain_until - time.monotonic()
                    if remaining <= 0:
                        break
                    for key, _ in selector.select(remaining):
                        before = _read(selector, key.fd, buffers[key.fd], caps[key.fd])
                        if key.fd == status_r:
                            _first_line_only(status, caps, status_r, before)
                    out.output_exceeded = len(stdout) > limits.output_bytes
        finally:
            os.close(pidfd)
        out.stdout = bytes(stdout[: limits.output_bytes])
        out.stderr = bytes(stderr[-limits.stderr_bytes :]).decode("utf-8", "replace")
        out.record_exceeded = b"\n" not in status and len(status) >= record_cap
        out.read_records(bytes(status), bytes(exit_record))

    def _kill_everything(self, proc: subprocess.Popen[bytes], group: TestGroup | None) -> None:
        """SIGKILL the launcher's tree (the PID namespace dies with its init), every orphan re-parented
        to this worker, and every member of the test's cgroup."""
        self._stop(proc)
        self._sweep_orphans()
        if group is not None:
            group.kill_all(time.monotonic() + CLEANUP_S)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill the launcher and its descendants (the PID namespace dies with its init). The program's
        processes die first, while the harness lives to reap them: the init of a PID namespace reaps
        what is still running when it exits without adding that CPU time to its own, so a program
        killed with its harness was missing from the worker's CPU account (the job's ``cpu_s``)."""
        try:
            launcher = psutil.Process(proc.pid)
            tree, inits = launcher.children(recursive=True), launcher.children()
        except psutil.Error:
            tree, inits = [], []
        program = [p for p in tree if p not in inits]
        for p in program:
            with contextlib.suppress(psutil.Error):
                p.kill()
        until = time.monotonic() + 1.0
        while not all_gone(program) and time.monotonic() < until:
            time.sleep(0.001)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in [*tree]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def _clean_up(self, proc: subprocess.Popen[bytes], group: TestGroup | None, out: Execution) -> None:
        """Kill (again) and reap everything of this test, empty and remove its cgroup; raise
        :class:`SandboxError` if anything survives :data:`CLEANUP_S` seconds."""
        deadline = time.monotonic() + CLEANUP_S
        if proc.poll() is None:  # normally already killed by _collect
            self._stop(proc)
        try:
            proc.wait(timeout=CLEANUP_S)
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"the sandbox launcher (pid {proc.pid}) survived SIGKILL") from exc
        finally:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        orphans = self._sweep_orphans()
        if group is not None:
            out.memory_limit_hit = group.memory_limit_hit()
            group.kill_all(deadline)
            group.remove(deadline)
        while orphans:
            for pid in list(orphans):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                orphans.remove(pid)
            if not orphans:  # each re-parented its own children to this worker as it exited: swept next
                orphans = self._sweep_orphans()
            if orphans and time.monotonic() > deadline:
                raise SandboxError(f"sandboxed processes {sorted(orphans)} survived SIGKILL")
            if orphans:
                time.sleep(0.001)

    def _sweep_orphans(self) -> list[int]:
        """SIGKILL every child of this worker that was not its child before the test started: an
        orphan of the sandbox re-parented to the worker (a child subreaper while it evaluates).
        Returns their pids, for the caller to reap."""
        found = []
        for pid in children() - self._baseline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            found.append(pid)
        return found


def _first_line_only(status: bytearray, caps: dict[int, int | None], fd: int, since: int) -> None:
    """Once the status pipe has given a whole line, keep that line and drop whatever follows. Only the
    bytes kept by the last read (from ``since``) are searched: a large done record arrives in many reads,
    and searching it whole after each one was quadratic, time the test's limit counts."""
    end = status.find(b"\n", since)
    if end >= 0:
        del status[end + 1 :]
        caps[fd] = end + 1
