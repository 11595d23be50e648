"""Real tool worker processes for the worker tests: one started with its tools, a job for it, a test
coroutine run under a hard deadline, and a check that a process is gone; the fixture tool files."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from asyncroll.workers import JobRequest, ProcessWorker, ToolSpec

T = TypeVar("T")


TOOLS = Path(__file__).parent / "fixtures" / "tools"


COUNTER = TOOLS / "counter.py"


real_process = pytest.mark.timeout(30)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run one test coroutine under a hard deadline (the worker tests must never hang)."""

    async def bounded() -> T:
        async with asyncio.timeout(20):
            return await main

    return asyncio.run(bounded())


def gone(pid: int, within: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


async def started(*tools: ToolSpec, **kwargs: Any) -> ProcessWorker:
    worker = ProcessWorker(0, tools or (ToolSpec("add"),), startup_timeout=10, **kwargs)
    await worker.start()
    return worker


def job(job_id: int, tool: str, **arguments: Any) -> JobRequest:
    return JobRequest(job_id, tool, arguments)
