"""What the orphan tests share: a tool file whose tools leave processes behind (double forks, children
in sessions of their own, crashes), a pool of one real worker serving them, and ways to find each
test's own ``sleep`` by a unique duration and kill whatever of them is left (the ``durations`` fixture).
Used by test_worker_orphans (one worker) and test_pool_orphans (the pool and the runtime)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from asyncroll.clock import SystemClock
from asyncroll.errors import WorkerDied
from asyncroll.event_log import EventLog
from asyncroll.runtime.pool import WorkerPool
from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec
from tests.children import end

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")

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
    """Kill and reap the test's own children (each one, also when ending another fails)."""
    with contextlib.ExitStack() as stack:
        for process in processes:
            stack.callback(end, process)


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
