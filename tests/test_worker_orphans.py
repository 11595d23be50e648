"""Processes a tool double-forks (``setsid -f``, a daemon) leave the worker's tree by its parent links
unless the worker adopts them as a child subreaper; once the worker itself dies they are re-parented to
the runtime (a child subreaper while its pool runs), which kills them by the origin they inherited.
Real processes: each test finds exactly its own ``sleep`` by a unique duration, and kills whatever of
them is left, by pid, even when it fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from asyncroll import proctree
from asyncroll.clock import SystemClock
from asyncroll.errors import WorkerDied, WorkerTimeout
from asyncroll.event_log import EventLog
from asyncroll.proctree import is_subreaper
from asyncroll.runtime.pool import WorkerPool
from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec
from asyncroll.workers.spawn import tools_frame
from asyncroll.workers.upkeep import ORPHAN_ZOMBIES

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")
pytestmark = [linux_only, pytest.mark.timeout(60)]

TOOLS = '''
"""Tools that leave processes behind through a double fork, as ``setsid -f`` does."""
import os
import time


def _double_fork(argv, env=None):
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                if env is None:
                    os.execvp(argv[0], argv)
                os.execvpe(argv[0], argv, env)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def detach(duration: str) -> int:
    _double_fork(["sleep", duration])
    return 0


def detach_and_hang(duration: str, seconds: float) -> int:
    _double_fork(["sleep", duration])
    time.sleep(seconds)
    return 0


_kept = []


def start_child(code: int, new_session: bool = False) -> int:
    """A child the tool waits for in a later job (module state)."""
    import subprocess

    _kept.append(subprocess.Popen(["sh", "-c", f"exit {code}"], start_new_session=new_session))
    return _kept[-1].pid


def wait_child() -> int:
    return _kept.pop().wait()


def detach_bare(duration: str) -> int:
    """As ``detach``, in an environment of its own: nothing the worker passed on."""
    _double_fork(["sleep", duration], {"PATH": os.defpath})
    return 0


def in_session(duration: str) -> int:
    """A child in a session of its own, never waited for."""
    import subprocess

    _kept.append(subprocess.Popen(["sleep", duration], start_new_session=True))
    return _kept[-1].pid


def crash() -> int:
    os._exit(3)


def in_session_and_hang(duration: str, seconds: float) -> int:
    """A child in a session of its own, then past any timeout."""
    in_session(duration)
    time.sleep(seconds)
    return 0


def detach_short(count: int) -> int:
    for _ in range(count):
        _double_fork(["true"])  # exits at once: a zombie of whoever adopted it, until reaped
    return count
'''


def sleeping(duration: str) -> list[psutil.Process]:
    """The live ``sleep <duration>`` processes (the duration is unique to one test)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] == ["sleep", duration]:
            found.append(process)
    return found


@pytest.fixture
def durations() -> Iterator[Callable[[], str]]:
    """Unique ``sleep`` durations; afterwards every process still sleeping one of them is killed."""
    made: list[str] = []

    def make() -> str:
        made.append(f"{random.randint(5000, 9999)}.{os.getpid()}{len(made)}{random.randint(0, 9999):04d}")
        return made[-1]

    yield make
    for duration in made:
        for process in sleeping(duration):
            with contextlib.suppress(psutil.Error):
                process.kill()


@pytest.fixture
def tool_file(tmp_path: Path) -> Path:
    path = tmp_path / "orphan_tools.py"
    path.write_text(TOOLS)
    return path


def run(main: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(30):
            return await main

    return asyncio.run(bounded())


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the state changes in other processes
            await asyncio.sleep(0.01)


async def started(*tools: ToolSpec) -> ProcessWorker:
    worker = ProcessWorker(0, tools, startup_timeout=20)
    await worker.start()
    assert worker.pid is not None
    return worker


def process_pool(tool_file: Path) -> WorkerPool:
    """A pool of one real worker serving every tool of ``TOOLS``."""
    names = ("detach", "detach_bare", "in_session", "crash", "in_session_and_hang", "start_child")
    specs = [ToolSpec(name, tool_file) for name in names]
    clock = SystemClock()
    events = EventLog(clock)
    events.start_measurement()
    return WorkerPool(
        1, lambda i, g: ProcessWorker(i, specs, generation=g, startup_timeout=20), clock, events
    )


async def crash_and_replace(pool: WorkerPool, slot: int) -> None:
    """Crash the slot's worker mid-job (``os._exit``), as a tool can, and wait for its replacement."""
    old = pool.worker(slot)
    with pytest.raises(WorkerDied):
        await old.call(JobRequest(99, "crash", {}), 10)
    pool.replace_soon(slot, "died")  # what the dispatcher does
    await until(lambda: pool.idle == 1 and pool.worker(slot) is not old, within=20)


def ours(*processes: subprocess.Popen[bytes]) -> None:
    """Kill and reap the test's own children."""
    for process in processes:
        process.kill()
        process.wait(5)


def gone(process: psutil.Process, within: float = 5.0) -> bool:
    """True once ``process`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


async def parent_after_fork(process: psutil.Process, expected: int, within: float = 2.0) -> int:
    """``process``'s parent once it is ``expected``, or whatever it is after ``within`` seconds."""
    deadline = time.monotonic() + within
    while (parent := process.ppid()) != expected and time.monotonic() < deadline:  # noqa: ASYNC110 - set by other processes
        await asyncio.sleep(0.01)
    return parent


async def one_sleeping(duration: str, within: float = 5.0) -> psutil.Process:
    """The ``sleep <duration>`` once it runs: a tool returns as soon as the fork that started it exited,
    maybe before ``sleep`` was exec'd (its command line is the worker's until then)."""
    await until(lambda: bool(sleeping(duration)), within)
    found = sleeping(duration)
    assert len(found) == 1, found
    return found[0]


def test_a_double_forked_grandchild_is_adopted_and_killed_on_timeout(
    tool_file: Path, durations: Callable[[], str]
) -> None:
    duration = durations()

    async def main() -> psutil.Process:
        worker = await started(ToolSpec("detach_and_hang", tool_file))
        try:
            request = JobRequest(1, "detach_and_hang", {"duration": duration, "seconds": 30})
            call = asyncio.create_task(worker.call(request, timeout=2.0))
            orphan = await one_sleeping(duration)
            # adopted once its first parent, a fork of the worker, exits; not re-parented to init
            assert worker.pid is not None
            assert await parent_after_fork(orphan, worker.pid) == worker.pid
            with pytest.raises(WorkerTimeout, match="process tree was killed"):
                await call
            return orphan
        finally:
            await worker.kill()

    orphan = run(main())
    assert gone(orphan)  # SIGKILL was sent to it before the kill returned; it dies a moment later


def test_a_background_process_lives_with_the_worker_and_ends_when_it_closes(
    tool_file: Path, durations: Callable[[], str]
) -> None:
    duration = durations()

    async def main() -> psutil.Process:
        worker = await started(ToolSpec("detach", tool_file), ToolSpec("add"))
        try:
            assert (await worker.call(JobRequest(1, "detach", {"duration": duration}), 10)).reply.ok
            orphan = await one_sleeping(duration)
            assert orphan.ppid() == worker.pid
            assert (await worker.call(JobRequest(2, "add", {"a": 1, "b": 2}), 10)).reply.value == 3
            assert orphan.is_running()  # a job's background process is not killed after the job
            await worker.aclose()
            assert worker.returncode == 0  # it exited by itself, after ending its descendants
            return orphan
        finally:
            await worker.kill()

    orphan = run(main())
    assert not psutil.pid_exists(orphan.pid)  # killed and reaped by the worker: not even a zombie
    assert sleeping(duration) == []


def test_exited_orphans_are_reaped_between_jobs(tool_file: Path) -> None:
    async def main() -> None:
        worker = await started(ToolSpec("detach_short", tool_file), ToolSpec("add"))
        try:
            count = 3 * ORPHAN_ZOMBIES  # far more than the few the worker lets wait
            assert (
                await worker.call(JobRequest(1, "detach_short", {"count": count}), 10)
            ).reply.value == count
            process = psutil.Process(worker.pid)
            # each job is followed by a reap; once the orphans have exited, at most ORPHAN_ZOMBIES wait
            for job in range(2, 60):
                assert (await worker.call(JobRequest(job, "add", {"a": 1, "b": 1}), 10)).reply.ok
                if len(process.children()) <= ORPHAN_ZOMBIES:
                    break
                await asyncio.sleep(0.1)
            assert len(process.children()) <= ORPHAN_ZOMBIES
        finally:
            await worker.aclose()

    run(main())


def test_a_child_the_tool_waits_for_later_keeps_its_exit_status(tool_file: Path) -> None:
    """Reaping between jobs takes only orphans that left the worker's group: a tool's own child, waited
    for in a later job, still reports its real exit code (not the 0 of a stolen status)."""

    async def main() -> None:
        worker = await started(ToolSpec("start_child", tool_file), ToolSpec("wait_child", tool_file))
        try:
            pid = (await worker.call(JobRequest(1, "start_child", {"code": 7}), 10)).reply.value
            await until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie")
            args = {"code": 5, "new_session": True}  # out of the group, like an orphan: few, so kept
            other = (await worker.call(JobRequest(2, "start_child", args), 10)).reply.value
            await until(lambda: not psutil.pid_exists(other) or psutil.Process(other).status() == "zombie")
            assert (await worker.call(JobRequest(3, "start_child", {"code": 3}), 10)).reply.ok  # a reap
            assert (await worker.call(JobRequest(4, "wait_child", {}), 10)).reply.value == 3
            assert (await worker.call(JobRequest(5, "wait_child", {}), 10)).reply.value == 5
            assert (await worker.call(JobRequest(6, "wait_child", {}), 10)).reply.value == 7
        finally:
            await worker.aclose()

    run(main())


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's full isolation needs root")
def test_an_evaluation_leaves_the_worker_a_subreaper(tool_file: Path, durations: Callable[[], str]) -> None:
    """The sandbox turns the subreaper flag on for each test; it must not turn a worker's off after."""
    duration = durations()
    add = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    program = "a, b = map(int, input().split())\nprint(a + b)\n"

    async def main() -> None:
        worker = await started(ToolSpec("lcb_evaluate"), ToolSpec("detach", tool_file))
        try:
            evaluation = {"code": program, "tests": add}
            reply = (await worker.call(JobRequest(1, "lcb_evaluate", evaluation), 30)).reply
            assert reply.ok and reply.value["passed"], reply
            assert (await worker.call(JobRequest(2, "detach", {"duration": duration}), 10)).reply.ok
            assert (await one_sleeping(duration)).ppid() == worker.pid
        finally:
            await worker.aclose()

    run(main())
    assert sleeping(duration) == []


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_a_run_leaves_no_setsid_f_process_behind(tmp_path: Path, durations: Callable[[], str]) -> None:
    """The defect's own reproduction: ``setsid -f sleep`` in a tool that then times out, and in one that
    returns; and in one that then crashes its worker (``os._exit``), which also leaves a child in a
    session of its own. After ``asyncroll run`` ends no ``sleep`` is left."""
    hung, left, crashed, own = (durations() for _ in range(4))
    (tmp_path / "bg.py").write_text(
        "import os, subprocess, time\n\n\n"
        "def hang() -> int:\n"
        f"    subprocess.run(['setsid', '-f', 'sleep', '{hung}'])\n"
        "    time.sleep(100)\n"
        "    return 1\n\n\n"
        "def leave() -> int:\n"
        f"    subprocess.run(['setsid', '-f', 'sleep', '{left}'])\n"
        "    return 2\n\n\n"
        "def crash() -> int:\n"
        f"    subprocess.run(['setsid', '-f', 'sleep', '{crashed}'])\n"
        f"    subprocess.Popen(['sleep', '{own}'], start_new_session=True)\n"
        "    os._exit(4)\n"
    )
    problems: list[dict[str, Any]] = [
        {
            "id": name,
            "prompt": name,
            "tools": [{"name": name, "description": name, "inputs": {}, "implementation": "bg.py"}],
            "script": [{"type": "tool", "name": name, "arguments": {}}, {"type": "final", "answer": "x"}],
        }
        for name in ("hang", "leave", "crash")
    ]
    workload = tmp_path / "bg.jsonl"
    workload.write_text("".join(json.dumps(p) + "\n" for p in problems))
    command = [sys.executable, "-m", "asyncroll", "run", "--workload", str(workload)]
    command += ["--output", str(tmp_path / "out"), "--tool-timeout", "2"]
    t0 = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "worker restarts 2" in done.stdout + done.stderr
    assert time.monotonic() - t0 < 40
    assert [sleeping(d) for d in (hung, left, crashed, own)] == [[]] * 4


def test_a_dead_workers_orphans_are_killed_when_it_is_replaced(
    tool_file: Path, durations: Callable[[], str]
) -> None:
    """A worker that dies (a crash) leaves a double-forked ``sleep`` and a child in a session of its own.
    Re-parented to the runtime (a child subreaper while the pool runs), both carry the worker's origin:
    killed and reaped before the replacement takes work. The runtime's own children (one from before the
    pool, in a session of its own; one asyncio starts while it runs) are not touched, and the subreaper
    flag is restored at close."""
    detached, session, before, during = (durations() for _ in range(4))
    was_subreaper = is_subreaper()
    mine = subprocess.Popen(["sleep", before], start_new_session=True)

    async def main() -> list[psutil.Process]:
        pool = process_pool(tool_file)
        later: asyncio.subprocess.Process | None = None
        async with asyncio.TaskGroup() as tg:
            try:
                await pool.start(tg)
                assert is_subreaper()
                slot = pool.take_idle()
                assert slot is not None
                worker = pool.worker(slot)
                assert (await worker.call(JobRequest(1, "detach", {"duration": detached}), 10)).reply.ok
                assert (await worker.call(JobRequest(2, "in_session", {"duration": session}), 10)).reply.ok
                orphans = [await one_sleeping(detached), await one_sleeping(session)]
                assert [await parent_after_fork(o, worker.pid or 0) for o in orphans] == [worker.pid] * 2
                later = await asyncio.create_subprocess_exec("sleep", during)
                await crash_and_replace(pool, slot)
                assert not any(o.is_running() for o in orphans)  # killed, and reaped: not even zombies
                assert pool.orphans_killed == 2
                assert mine.poll() is None and later.returncode is None
            finally:
                await pool.aclose()
                assert mine.poll() is None and (later is None or later.returncode is None)
                if later is not None:
                    later.kill()
                    assert await later.wait() == -9  # its status was asyncio's to collect
        return orphans

    try:
        run(main())
        assert is_subreaper() == was_subreaper
    finally:
        ours(mine)
    assert sleeping(detached) == [] and sleeping(session) == []


def test_an_orphan_that_cleared_its_environment_is_left_to_whoever_owns_it(
    tool_file: Path, durations: Callable[[], str]
) -> None:
    """An orphan whose environment was replaced carries no origin: nothing tells it from a child another
    part of the program started (a server in a session of its own), so the pool never kills it, at a
    replacement or at close (the README's "not covered"). The test kills it itself."""
    duration = durations()

    async def main() -> psutil.Process:
        pool = process_pool(tool_file)
        async with asyncio.TaskGroup() as tg:
            try:
                await pool.start(tg)
                slot = pool.take_idle()
                assert slot is not None
                worker = pool.worker(slot)
                assert (await worker.call(JobRequest(1, "detach_bare", {"duration": duration}), 10)).reply.ok
                orphan = await one_sleeping(duration)
                await crash_and_replace(pool, slot)
                assert orphan.is_running() and orphan.ppid() == os.getpid()  # adopted, not attributed
            finally:
                await pool.aclose()
        assert pool.orphans_killed == 0
        return orphan

    orphan = run(main())
    try:
        assert orphan.is_running()
    finally:
        orphan.kill()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(orphan.pid, 0)
    assert sleeping(duration) == []


def test_a_timed_out_workers_children_in_sessions_of_their_own_leave_no_zombie(
    tool_file: Path, durations: Callable[[], str]
) -> None:
    """A worker killed at a timeout takes its descendants down with it; one in a session of its own dies
    after the worker and, the runtime being a child subreaper, became the runtime's zombie for good (three
    per replacement in review). The pool reaps what the kill signalled."""
    duration = durations()

    def zombies() -> list[int]:
        return [pid for pid in proctree.children() if (info := proctree.state(pid)) and info[0] == "Z"]

    async def main() -> list[int]:
        pool = process_pool(tool_file)
        async with asyncio.TaskGroup() as tg:
            try:
                await pool.start(tg)
                slot = pool.take_idle()
                assert slot is not None
                old = pool.worker(slot)
                with pytest.raises(WorkerTimeout):
                    await old.call(
                        JobRequest(1, "in_session_and_hang", {"duration": duration, "seconds": 60}), 1
                    )
                pool.replace_soon(slot, "timeout")  # what the dispatcher does
                await until(lambda: pool.idle == 1 and pool.worker(slot) is not old, within=20)
                left = zombies()
            finally:
                await pool.aclose()
        return left

    assert run(main()) == [] and zombies() == []
    assert sleeping(duration) == []


def test_a_worker_whose_runtime_died_as_it_started_leaves_at_once() -> None:
    """Linux sends the death signal only to a worker that asked for it before its parent died: one
    whose runtime was SIGKILLed while its interpreter started lived on, alone, as long as its tools took
    to import. A worker whose parent is not the runtime that spawned it leaves before anything else."""
    job_r, job_w = os.pipe()
    reply_r, reply_w = os.pipe()
    try:
        command = [sys.executable, "-P", "-m", "asyncroll.workers.child", "--in-fd", str(job_r)]
        command += ["--out-fd", str(reply_w)]
        for parent, code in ((os.getpid() + 10_000_000, 1), (os.getpid(), 0)):  # no process has the first
            proc = subprocess.Popen(
                [*command, "--parent-pid", str(parent)], cwd=REPO, pass_fds=(job_r, reply_w)
            )
            if code == 0:  # its own runtime: it starts, reports ready and serves until its input ends
                os.write(job_w, tools_frame([]))
                ready = os.read(reply_r, 1 << 16)
                assert ready
            else:
                assert proc.wait(timeout=30) == code
                continue
            os.close(job_w)
            job_w = -1
            assert proc.wait(timeout=30) == code
    finally:
        for fd in (job_r, job_w, reply_r, reply_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def test_a_dead_workers_exited_children_in_sessions_of_their_own_leave_no_zombie(tool_file: Path) -> None:
    """A child a tool started in a session of its own and never waited for exits after the job replied:
    the worker holds it unreaped (it may be waited for in a later job). When the worker dies, that zombie
    is re-parented to the runtime; its environment cannot be read and its session is no worker's, so
    nothing attributed it and it stayed the runtime's zombie for the whole run (the soak: 146 after 63
    workers killed from outside). Each reply names the worker's children outside its group; the pool
    reaps those that are zombies once the worker died."""

    started: list[int] = []

    async def main() -> str | None:
        pool = process_pool(tool_file)
        async with asyncio.TaskGroup() as tg:
            try:
                await pool.start(tg)
                slot = pool.take_idle()
                assert slot is not None
                worker = pool.worker(slot)
                call = await worker.call(JobRequest(1, "start_child", {"code": 0, "new_session": True}), 10)
                started.append(pid := call.reply.value)
                await until(lambda: (proctree.state(pid) or ("?",))[0] == "Z")  # exited, held by the worker
                await crash_and_replace(pool, slot)
                left = proctree.state(pid) if pid in proctree.children() else None
            finally:
                await pool.aclose()
        return None if left is None else left[0]

    try:
        left = run(main())
        assert started and left is None, f"pid {started} is still the runtime's child ({left})"
    finally:
        for pid in started:  # the test's own clean-up, fix or not
            if pid in proctree.children():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
