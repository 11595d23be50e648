"""Processes a tool double-forks (``setsid -f``, a daemon) leave the worker's tree by its parent links
unless the worker adopts them as a child subreaper: one worker's own adoption, reaping and kill.
Real processes: each test finds exactly its own ``sleep`` by a unique duration, and kills whatever of
them is left, by pid, even when it fails (tests/orphan_tools.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from asyncroll.errors import WorkerTimeout
from asyncroll.workers import JobRequest, ToolSpec
from asyncroll.workers.spawn import tools_frame
from asyncroll.workers.upkeep import ORPHAN_ZOMBIES
from tests import orphan_tools
from tests.children import end
from tests.evaluations import WEAK_UNLESS_ROOT
from tests.orphan_tools import (
    REPO,
    gone,
    linux_only,
    one_sleeping,
    parent_after_fork,
    run,
    sleeping,
    started,
    until,
)

durations = orphan_tools.durations  # the fixtures, found by their names
tool_file = orphan_tools.tool_file
pytestmark = [linux_only, pytest.mark.timeout(60)]


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


def test_an_evaluation_leaves_the_worker_a_subreaper(tool_file: Path, durations: Callable[[], str]) -> None:
    """The sandbox turns the subreaper flag on for each test; it must not turn a worker's off after."""
    duration = durations()
    add = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    program = "a, b = map(int, input().split())\nprint(a + b)\n"

    async def main() -> None:
        worker = await started(ToolSpec("lcb_evaluate"), ToolSpec("detach", tool_file))
        try:
            evaluation = {"code": program, "tests": add, **WEAK_UNLESS_ROOT}
            reply = (await worker.call(JobRequest(1, "lcb_evaluate", evaluation), 30)).reply
            assert reply.ok and reply.value["passed"], reply
            assert (await worker.call(JobRequest(2, "detach", {"duration": duration}), 10)).reply.ok
            assert (await one_sleeping(duration)).ppid() == worker.pid
        finally:
            await worker.aclose()

    run(main())
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
            try:
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
                end(proc)
    finally:
        for fd in (job_r, job_w, reply_r, reply_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
