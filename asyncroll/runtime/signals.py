"""SIGINT and SIGTERM cancel a run: the one place that turns a signal into an ``interrupted`` outcome
(``asyncroll run``, ``simulate``, a sweep's cells)."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from types import FrameType
from typing import Any

from asyncroll.outputs.receipt import EXIT_INTERRUPTED
from asyncroll.runtime.run import Run, RunOutcome


async def interruptible(run: Run, *, keep_ignored: bool = False) -> RunOutcome:
    """``run.execute()`` with SIGINT and SIGTERM cancelling it and the signal recorded as the reason, as
    in ``asyncroll run``; an interrupted run returns an ``interrupted`` outcome (exit code 130, no
    summary) instead of raising. ``keep_ignored``: a signal this process ignores (a sweep's cell
    processes ignore both) stays ignored. The handlers in place before are put back afterwards.

    The handler is a plain ``signal.signal`` one (as ``asyncio.Runner`` installs for SIGINT), not
    ``loop.add_signal_handler``: it records the signal at once, even while the run is in a synchronous
    stretch (building the summary, writing the exports), whose signal a loop callback would only see after
    the handlers were removed — the signal lost. The cancellation itself goes through the loop. A signal
    that arrives after every trajectory has finished (cleanup, exports) leaves the run ``complete``; the
    outcome's ``late_signal`` names it, for the caller to report."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    finished = False

    def cancel(name: str) -> None:
        if not finished:
            task.cancel(f"{name} received")

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if run.interrupt_reason is None:
            name = signal.Signals(signum).name
            run.interrupt_reason = name
            loop.call_soon_threadsafe(cancel, name)

    installed: list[tuple[signal.Signals, Any]] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if keep_ignored and previous == signal.SIG_IGN:
            continue
        try:
            signal.signal(sig, on_signal)
        except (ValueError, OSError):  # not the main thread, or no signals here
            continue
        installed.append((sig, previous))
    try:
        outcome = await run.execute()
        if run.interrupt_reason is not None:
            outcome = dataclasses.replace(outcome, late_signal=run.interrupt_reason)
        return outcome
    except asyncio.CancelledError:
        if run.interrupt_reason is None:
            raise
        return RunOutcome("interrupted", EXIT_INTERRUPTED, None, f"interrupted by {run.interrupt_reason}")
    finally:
        finished = True
        for sig, previous in installed:
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)


def late_signal_note(name: str) -> str:
    """What the CLI says when a signal came after every trajectory had finished."""
    return f"{name} received after every trajectory had finished: the run is complete and so are its outputs"
