"""A real tool worker process that fails: timeouts, deaths from outside, cancelled calls and start-up
failures are each detected and reported, the worker's process tree killed, and no process or file
descriptor left behind; a worker never started is safe to close."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from asyncroll.errors import WorkerDied, WorkerStartupError, WorkerTimeout
from asyncroll.workers import ProcessWorker, ToolSpec
from tests.worker_processes import COUNTER, TOOLS, gone, job, real_process, run, started


@real_process
def test_timeout_kills_the_worker_and_its_setsid_grandchild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "grandchild.pid"
    monkeypatch.setenv("ASYNCROLL_TEST_GRANDCHILD_FILE", str(marker))

    async def main() -> tuple[int, int]:
        worker = await started(ToolSpec("spawn_and_sleep", COUNTER))
        with pytest.raises(WorkerTimeout, match="process tree was killed"):
            await worker.call(job(1, "spawn_and_sleep", seconds=30), timeout=1.0)
        assert not worker.alive and worker.returncode is not None
        with pytest.raises(WorkerDied):
            await worker.call(job(2, "spawn_and_sleep", seconds=0), timeout=1.0)
        assert worker.pid is not None
        return worker.pid, int(marker.read_text())

    worker_pid, grandchild_pid = run(main())
    assert gone(worker_pid)
    assert gone(grandchild_pid)


@real_process
def test_external_sigkill_while_idle_is_detected() -> None:
    async def main() -> None:
        worker = await started()
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        assert await worker.wait_exit() == -signal.SIGKILL
        assert not worker.alive
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await worker.call(job(1, "add", a=1, b=2), timeout=5)
        await worker.kill()

    run(main())


@real_process
def test_death_during_a_job_raises_worker_died() -> None:
    async def main() -> None:
        worker = await started(ToolSpec("sleep_ms"))
        assert worker.pid is not None
        asyncio.get_running_loop().call_later(0.2, os.kill, worker.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await worker.call(job(1, "sleep_ms", milliseconds=10_000), timeout=15)
        assert time.monotonic() - t0 < 5
        await worker.kill()

    run(main())


@real_process
def test_death_is_detected_while_a_forked_descendant_holds_the_reply_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "forked.pid"
    monkeypatch.setenv("ASYNCROLL_TEST_GRANDCHILD_FILE", str(marker))

    async def main() -> int:
        worker = await started(ToolSpec("fork_and_sleep", COUNTER))
        assert worker.pid is not None
        call = asyncio.create_task(worker.call(job(1, "fork_and_sleep", seconds=30), timeout=15))
        while not marker.exists() or not marker.read_text():  # noqa: ASYNC110 - another process writes it
            await asyncio.sleep(0.01)
        os.kill(worker.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await call
        assert time.monotonic() - t0 < 2  # no waiting for the pipe's end of stream
        await worker.kill()  # the fork stayed in the worker's process group
        return int(marker.read_text())

    assert gone(run(main()))


@real_process
def test_no_fds_or_children_left_behind() -> None:
    def open_fds() -> set[str]:
        """The open descriptors, by number and what they point to. Garbage from earlier tests is
        collected first: one collected during the test closed an fd and broke a count comparison."""
        gc.collect()
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor, closed by now
                continue
        return {f"{fd} -> {target}" for fd, target in fds.items()}

    async def main() -> None:
        # children of this process before the workers: multiprocessing's resource tracker, which an earlier
        # test's in-process sweep (its cell pool) started, lives as long as the process
        others = {p.pid for p in psutil.Process().children()}
        for i in range(4):
            worker = await started(ToolSpec("sleep_ms"))
            if i % 2:
                with pytest.raises(WorkerTimeout):
                    await worker.call(job(1, "sleep_ms", milliseconds=5_000), timeout=0.2)
            else:
                await worker.call(job(1, "sleep_ms", milliseconds=1), timeout=5)
                await worker.aclose()
        assert [p for p in psutil.Process().children() if p.pid not in others] == []

    before = open_fds()
    run(main())
    assert open_fds() - before == set()  # nothing the workers opened is left open


@real_process
def test_cancelling_a_call_kills_the_worker_and_propagates() -> None:
    async def main() -> None:
        worker = await started(ToolSpec("sleep_ms"))
        task = asyncio.create_task(worker.call(job(1, "sleep_ms", milliseconds=10_000), timeout=15))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not worker.alive and worker.returncode == -signal.SIGKILL
        assert worker.pid is not None and gone(worker.pid)

    run(main())


@real_process
@pytest.mark.parametrize(
    ("tools", "timeout", "message"),
    [
        ((ToolSpec("nope", COUNTER),), 10, "no callable named 'nope'"),
        ((ToolSpec("whatever", TOOLS / "broken_import.py"),), 10, "broken on purpose"),
        ((ToolSpec("f", TOOLS / "closes_stdio_then_raises.py"),), 10, "broken after closing stdio"),
        ((ToolSpec("f", TOOLS / "missing.py"),), 10, "FileNotFoundError"),
        ((ToolSpec("lcb_nonexistent"),), 10, "unknown built-in tool"),
        (
            (ToolSpec("ready", TOOLS / "slow_import.py"),),
            0.5,
            r"not ready within 0.5s \(--worker-startup-timeout\)",
        ),
        ((ToolSpec("add"),), 0.001, r"within 0.001s \(--worker-startup-timeout\)"),
    ],
    ids=[
        "missing-function",
        "raises-on-import",
        "raises-on-import-without-stdio",
        "missing-file",
        "unknown-builtin",
        "startup-timeout",
        "spawn-timeout",
    ],
)
def test_startup_failures_raise_and_leave_no_process(
    tmp_path: Path, tools: tuple[ToolSpec, ...], timeout: float, message: str
) -> None:
    worker = ProcessWorker(3, tools, startup_timeout=timeout)
    with pytest.raises(WorkerStartupError, match=message) as failure:
        run(worker.start())
    if timeout > 1:  # the worker itself reported the failure (not read from a log: there is none)
        assert "could not load its tools" in str(failure.value)
    if worker.pid is not None:  # else it timed out before the process was spawned
        assert gone(worker.pid, within=1.0) and worker.returncode is not None
    assert not worker.alive


@real_process
def test_death_during_startup_reports_status_and_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("output of an earlier generation\n")
    worker = ProcessWorker(1, [ToolSpec("f", TOOLS / "exits_on_import.py")], startup_timeout=10, log_path=log)
    with pytest.raises(WorkerStartupError, match="exit status 3") as failure:
        run(worker.start())
    assert "about to exit from tool import" in str(failure.value)
    assert "earlier generation" not in str(failure.value)
    assert worker.pid is not None and gone(worker.pid, within=1.0)


def test_unstarted_worker_is_safe_to_close_and_refuses_calls() -> None:
    async def main() -> None:
        worker = ProcessWorker(0, [ToolSpec("add")], generation=2, startup_timeout=1)
        assert (worker.generation, worker.alive, worker.returncode, worker.cpu_seconds()) == (
            2,
            False,
            None,
            None,
        )
        with pytest.raises(WorkerDied):
            await worker.call(job(1, "add", a=1, b=2), timeout=1)
        await worker.aclose()
        await worker.kill()

    run(main())


@real_process
def test_a_worker_that_exits_mid_job_names_its_log(tmp_path: Path) -> None:
    """A tool that ends its worker with an exit status of its own (``os._exit``; an ``OSError`` after it
    closed the worker's pipes) said only "closed its reply pipe, exit status 3": the traceback that says
    why is in the worker's log, which the message did not name."""
    tools = tmp_path / "leaving.py"
    tools.write_text("import os\n\ndef leave() -> None:\n    print('leaving', flush=True)\n    os._exit(3)\n")
    log = tmp_path / "worker-1.log"

    async def main() -> None:
        worker = await started(ToolSpec("leave", tools), log_path=log)
        try:
            with pytest.raises(WorkerDied, match=rf"exit status 3; its log: {re.escape(str(log))}$"):
                await worker.call(job(1, "leave"), timeout=10)
        finally:
            await worker.aclose()

    run(main())
    assert "leaving" in log.read_text()


@real_process
def test_a_worker_killed_while_a_large_request_is_written_fails_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large request is written a piece at a time as the pipe takes it: the worker dying in between
    (killed after the first piece) ends the call with WorkerDied, the wait for the pipe ending with it."""

    async def main() -> None:
        worker = await started(ToolSpec("sizes", TOOLS / "sizes.py"))
        assert worker.pid is not None
        pid, taken = worker.pid, worker._job_pipe.taken
        written: list[bool] = []

        async def kill_then_wait() -> None:
            if not written:
                written.append(worker._sent)
                os.kill(pid, signal.SIGKILL)
            await taken()

        monkeypatch.setattr(worker._job_pipe, "taken", kill_then_wait)
        tests = [{"input": "x" * 1000, "output": str(i)} for i in range(50_000)]  # 50 MB
        with pytest.raises(WorkerDied, match="SIGKILL"):
            await worker.call(job(1, "sizes", tests=tests), timeout=15, large=True)
        assert written == [True] and not worker.alive
        await worker.kill()
        assert gone(pid)

    run(main())
