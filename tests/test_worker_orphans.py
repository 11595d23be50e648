"""Processes a tool double-forks (``setsid -f``, a daemon) leave the worker's tree by its parent links
unless the worker adopts them as a child subreaper. Real processes: each test finds exactly its own
``sleep`` by a unique duration, and kills whatever of them is left, by pid, even when it fails."""

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

from asyncroll.errors import WorkerTimeout
from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec
from asyncroll.workers.child import ORPHAN_ZOMBIES

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")
pytestmark = [linux_only, pytest.mark.timeout(60)]

TOOLS = '''
"""Tools that leave processes behind through a double fork, as ``setsid -f`` does."""
import os
import time


def _double_fork(argv):
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.execvp(argv[0], argv)
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
    returns; after ``asyncroll run`` ends neither ``sleep`` is left."""
    hung, left = durations(), durations()
    (tmp_path / "bg.py").write_text(
        "import subprocess, time\n\n\n"
        "def hang() -> int:\n"
        f"    subprocess.run(['setsid', '-f', 'sleep', '{hung}'])\n"
        "    time.sleep(100)\n"
        "    return 1\n\n\n"
        "def leave() -> int:\n"
        f"    subprocess.run(['setsid', '-f', 'sleep', '{left}'])\n"
        "    return 2\n"
    )
    problems: list[dict[str, Any]] = [
        {
            "id": name,
            "prompt": name,
            "tools": [{"name": name, "description": name, "inputs": {}, "implementation": "bg.py"}],
            "script": [{"type": "tool", "name": name, "arguments": {}}, {"type": "final", "answer": "x"}],
        }
        for name in ("hang", "leave")
    ]
    workload = tmp_path / "bg.jsonl"
    workload.write_text("".join(json.dumps(p) + "\n" for p in problems))
    command = [sys.executable, "-m", "asyncroll", "run", "--workload", str(workload)]
    command += ["--output", str(tmp_path / "out"), "--tool-timeout", "2"]
    t0 = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "worker restarts 1" in done.stdout + done.stderr
    assert time.monotonic() - t0 < 40
    assert sleeping(hung) == [] and sleeping(left) == []
