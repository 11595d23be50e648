"""The worker pool with real processes: workers killed from outside are noticed and replaced."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from asyncroll.clock import SystemClock
from asyncroll.events import EventCapture, EventLog, WorkerRestarting
from asyncroll.policies import get_policy
from asyncroll.runtime.dispatcher import CpuDispatcher, JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.pool import WorkerPool
from asyncroll.workers.builtin import BUILTIN_TOOLS
from asyncroll.workers.process import ProcessWorker
from asyncroll.workers.protocol import JobRequest, ToolSpec

T = TypeVar("T")
SPECS = [ToolSpec(name) for name in BUILTIN_TOOLS]


def _pool(size: int) -> tuple[WorkerPool, EventLog, EventCapture]:
    clock = SystemClock()
    events = EventLog(clock)
    events.start_measurement()
    capture = EventCapture()
    events.subscribe(capture)
    pool = WorkerPool(
        size, lambda i, g: ProcessWorker(i, SPECS, generation=g, startup_timeout=30), clock, events
    )
    return pool, events, capture


async def _until(predicate: Callable[[], bool], within: float = 15) -> None:
    """Poll real state (real processes die on their own schedule) under a hard deadline."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the state changes in other processes, not via an Event
            await asyncio.sleep(0.01)


def _run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(main())  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_idle_worker_killed_from_outside_is_replaced() -> None:
    async def main() -> None:
        pool, _, capture = _pool(2)
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            old = pool.worker(0)
            old_pid = old.pid
            assert old_pid is not None
            os.kill(old_pid, signal.SIGKILL)
            await _until(lambda: pool.snapshot().idle == 2 and pool.worker(0) is not old)
            restarts = capture.of(WorkerRestarting)
            assert [(r.worker, r.reason, r.generation, r.old_pid) for r in restarts] == [
                (0, "died", 1, old_pid)
            ]
            new = pool.worker(0)
            assert new.pid != old_pid and new.generation == 1
            result = await new.call(JobRequest(1, "add", {"a": 2, "b": 3}), timeout=10)
            assert result.reply.value == 5
            assert pool.snapshot().restarts == 1 and pool.replaced_any
            await pool.aclose()

    _run(main)


@pytest.mark.timeout(60)
def test_busy_worker_killed_from_outside_fails_its_job_and_is_replaced() -> None:
    async def main() -> None:
        pool, events, capture = _pool(1)
        clock = SystemClock()
        gate = ModelGate(1, clock, events)
        dispatcher = CpuDispatcher(pool, get_policy("fifo"), gate, clock, events, tool_timeout=30)
        async with asyncio.TaskGroup() as tg:
            await pool.start(tg)
            victim = pool.worker(0).pid
            assert victim is not None
            job = tg.create_task(
                dispatcher.run(JobSpec("t", "tool", "sleep_ms", {"milliseconds": 20_000}, 0))
            )
            await _until(lambda: pool.snapshot().busy == 1)
            await asyncio.sleep(0.2)  # let the job reach the worker
            os.kill(victim, signal.SIGKILL)
            outcome = await job
            assert not outcome.ok and outcome.failure == "worker_died"
            await _until(lambda: pool.snapshot().idle == 1)
            follow = await dispatcher.run(JobSpec("t", "tool", "add", {"a": 1, "b": 1}, 1))
            assert follow.ok and follow.value == 2
            assert [r.reason for r in capture.of(WorkerRestarting)] == ["died"]
            assert pool.worker(0).pid != victim
            await pool.aclose()

    _run(main)
