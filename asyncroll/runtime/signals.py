"""SIGINT and SIGTERM cancel a run: the one place that turns a signal into an ``interrupted`` outcome
(``asyncroll run``, ``simulate``, a sweep's cells)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from asyncroll.runtime.run import EXIT_INTERRUPTED, Run, RunOutcome


async def interruptible(run: Run, *, keep_ignored: bool = False) -> RunOutcome:
    """``run.execute()`` with SIGINT and SIGTERM cancelling it and the signal recorded as the reason, as
    in ``asyncroll run``; an interrupted run returns an ``interrupted`` outcome (exit code 130, no
    summary) instead of raising. ``keep_ignored``: a signal this process ignores (a sweep's cell
    processes ignore both) stays ignored. The handlers in place before are put back afterwards."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None

    def interrupt(name: str) -> None:
        if run.interrupt_reason is None:
            run.interrupt_reason = name
            task.cancel(f"{name} received")

    installed: list[tuple[signal.Signals, Any]] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if keep_ignored and previous == signal.SIG_IGN:
            continue
        try:
            loop.add_signal_handler(sig, interrupt, sig.name)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            continue
        installed.append((sig, previous))
    try:
        return await run.execute()
    except asyncio.CancelledError:
        if run.interrupt_reason is None:
            raise
        return RunOutcome("interrupted", EXIT_INTERRUPTED, None, f"interrupted by {run.interrupt_reason}")
    finally:
        for sig, previous in installed:
            loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
