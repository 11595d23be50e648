"""Once a worker itself dies, what it left behind is re-parented to the runtime (a child subreaper while
its pool runs), which kills it by the origin it inherited and reaps what is its to reap.
Real processes: each test finds exactly its own ``sleep`` by a unique duration, and kills whatever of
them is left, by pid, even when it fails (tests/orphan_tools.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncroll import proctree
from asyncroll.errors import WorkerTimeout
from asyncroll.proctree import is_subreaper
from asyncroll.runtime.pool import WorkerPool
from asyncroll.workers import JobRequest
from tests import orphan_tools
from tests.orphan_tools import (
    REPO,
    crash_and_replace,
    linux_only,
    one_sleeping,
    ours,
    parent_after_fork,
    process_pool,
    run,
    sleeping,
    until,
)

durations = orphan_tools.durations  # the fixtures, found by their names
tool_file = orphan_tools.tool_file
pytestmark = [linux_only, pytest.mark.timeout(60)]


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
    replacement or at close (docs/RUNNING.md's "not covered"). The test kills it itself."""
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


@pytest.mark.timeout(30)
def test_what_the_adopter_remembers_stays_bounded_over_many_restarts(
    tool_file: Path, durations: Callable[[], str]
) -> None:
    """Each restart added the dead worker's origin, its session, the orphans signalled and reaped and the
    pids its kill signalled to sets kept for the whole run (~0.3 KB a restart, without bound over a long
    run with many restarts). What can no longer matter is forgotten: an origin once no process carries
    it, a session once no process is in it, a pid once reaped or gone."""
    restarts = 6

    def remembered(pool: WorkerPool) -> dict[str, int]:
        adopter = pool._adopter  # the bookkeeping itself: nothing outside shows it
        assert adopter is not None
        kept: dict[str, set[str] | set[int]] = {
            "origins": adopter.origins,
            "sessions": adopter._sessions,
            "doomed": adopter.doomed,
        }
        kept |= {"signalled": adopter._signalled, "reaped": adopter._reaped, "named": adopter.named}
        return {name: len(pids) for name, pids in kept.items()}

    async def main() -> list[dict[str, int]]:
        pool = process_pool(tool_file)
        sizes = []
        async with asyncio.TaskGroup() as tg:
            try:
                await pool.start(tg)
                for job in range(restarts):
                    slot = pool.take_idle()
                    assert slot is not None
                    old = pool.worker(slot)
                    if job % 2:  # a timeout: the kill signals the worker's descendants (doomed)
                        args = {"duration": durations(), "seconds": 60}
                        with pytest.raises(WorkerTimeout):
                            await old.call(JobRequest(job, "in_session_and_hang", args), 0.5)
                        pool.replace_soon(slot, "timeout")
                        replaced = lambda s=slot, o=old: pool.idle == 1 and pool.worker(s) is not o  # noqa: E731
                        await until(replaced, within=20)
                    else:  # a crash: its orphan carries its origin, killed by the sweep
                        request = JobRequest(job, "in_session", {"duration": durations()})
                        assert (await old.call(request, 10)).reply.ok
                        await crash_and_replace(pool, slot)
                    sizes.append(remembered(pool))
            finally:
                await pool.aclose()
        assert pool.orphans_killed >= restarts // 2  # the crashed workers' (a timeout's may add)
        return sizes

    sizes = run(main())
    # the current worker's origin and session, the last dead worker's session (its pid was still the
    # slot's during the sweep); whatever a sweep reaped stays until the next sweep
    for name, bound in {"origins": 1, "sessions": 2, "doomed": 0, "signalled": 0, "named": 0}.items():
        assert max(s[name] for s in sizes) <= bound, (name, sizes)
    assert max(s["reaped"] for s in sizes) <= 1, sizes
