"""SIGINT, SIGTERM and SIGHUP cancel a run: the one place that turns a signal into an ``interrupted``
outcome (``asyncroll run``, ``simulate``, a sweep's cells), and that keeps a command's signals in order
before its run starts and after its outcome is final (:class:`CommandSignals`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

from asyncroll.cli_signals import put_back
from asyncroll.outputs.receipt import EXIT_INTERRUPTED
from asyncroll.outputs.rundir import ExportStop, skipped
from asyncroll.runtime.run import Run, RunOutcome

#: The signals that stop a run: Ctrl-C, a polite kill, and the terminal going away.
STOP_SIGNALS = tuple(
    sig for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig is not None
)

_SIGHUP = getattr(signal, "SIGHUP", None)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """The stop signals blocked while the block runs (where the OS has signal masks), then delivered. A
    process started inside inherits the mask: it gets none of them until it unblocks them (a sweep's cell
    process, once it ignores them), so a Ctrl-C to the terminal's process group as it starts cannot
    interrupt its start-up (multiprocessing's resource tracker starts this way)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:  # a stop signal that came just before has its handler run inside pthread_sigmask, once they are
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # blocked: its KeyboardInterrupt unblocks them
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


async def interruptible(run: Run, *, keep_ignored: bool = False) -> RunOutcome:
    """``run.execute()`` with SIGINT, SIGTERM and SIGHUP cancelling it and the signal recorded as the
    reason, as in ``asyncroll run``; an interrupted run returns an ``interrupted`` outcome (exit code 130, no
    summary) instead of raising. ``keep_ignored``: a signal this process ignores (a sweep's cell
    processes ignore both) stays ignored. An ignored SIGHUP always does: ``nohup asyncroll run …`` asked
    that the terminal's hangup not stop the run. The handlers in place before are put back afterwards.

    The handler is a plain ``signal.signal`` one (as ``asyncio.Runner`` installs for SIGINT), not
    ``loop.add_signal_handler``: it records the signal at once, even while the run is in a synchronous
    stretch (building the summary, writing the exports), whose signal a loop callback would only see after
    the handlers were removed — the signal lost. The cancellation itself goes through the loop. A signal
    that arrives after every trajectory has finished (cleanup, exports) leaves the run ``complete``; the
    outcome's ``late_signal`` names it, for the caller to report. Any signal while the exports are written
    (a second Ctrl-C, say) skips those not written yet (:class:`~asyncroll.outputs.rundir.ExportStop`)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    finished = False

    def cancel(name: str) -> None:
        if not finished:
            task.cancel(f"{name} received")

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if run.interrupt_reason is None:
            run.interrupt_reason = name
            loop.call_soon_threadsafe(cancel, name)
        stop.signal(name)  # while the exports are written: raises there, skipping those not written yet

    stop = ExportStop()
    installed: list[tuple[signal.Signals, Any]] = []
    for sig in STOP_SIGNALS:
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN and (keep_ignored or sig == _SIGHUP):
            continue
        try:
            signal.signal(sig, on_signal)
        except (ValueError, OSError):  # not the main thread, or no signals here
            continue
        installed.append((sig, previous))
    run.exports_stop = stop if installed else None  # the exports say how to skip them only if one can
    try:
        outcome = await run.execute()
        if run.interrupt_reason is not None:
            outcome = dataclasses.replace(outcome, late_signal=run.interrupt_reason)
        return outcome
    except asyncio.CancelledError:
        if run.interrupt_reason is None:
            raise
        task.uncancel()  # handled: this task's later awaits must not see the cancellation again
        reason = f"interrupted by {run.interrupt_reason}"
        return RunOutcome(
            "interrupted",
            EXIT_INTERRUPTED,
            None,
            reason,
            exports_failed=run.exports_failed,
            moved_to=run.moved_to,
            gone=run.gone,
        )
    finally:
        finished = True
        for sig, previous in installed:
            put_back(sig, previous)


def late_signal_note(name: str, exports_failed: Mapping[str, str] | None = None) -> str:
    """What the CLI says when a signal came after every trajectory had finished (``exports_failed``: as
    :class:`RunOutcome`'s, whose exports a signal may have skipped, which the CLI said before)."""
    said = f"{name} received after every trajectory had finished: the run is complete"
    if any(skipped(why) for why in (exports_failed or {}).values()):
        return f"{said}, its exports skipped"
    return f"{said} and so are its outputs"


class CommandSignals:
    """A command's signals outside its run (``asyncroll run``, ``simulate``; :func:`interruptible` takes
    over while a run executes). Installed: SIGTERM and SIGHUP do what SIGINT does (a KeyboardInterrupt,
    or asyncio's cancellation while an event loop runs), so validation and set-up stop as cleanly on any
    of them — exit 130, the signal named (:attr:`received`). After :meth:`hold` (the outcome is final,
    only printing is left) each of the three is recorded and otherwise ignored: it used to kill the
    process, or end it with a traceback and a wrong exit code. :meth:`restore` puts the handlers back."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._held = False
        self._previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        from asyncroll.cli_signals import interrupted_by, is_guard

        if (early := interrupted_by()) is not None:  # its KeyboardInterrupt was swallowed (it came during
            self.received = early  # a weakref callback or a __del__): the command stops here, exit 130
            raise KeyboardInterrupt(early)
        for sig in STOP_SIGNALS:
            if sig is signal.SIGINT:  # Python's own handler (or the caller's) raises KeyboardInterrupt;
                self._previous[sig] = previous = signal.getsignal(sig)  # put back by restore()
                if is_guard(previous):  # the CLI's: Python's own instead, over which asyncio.run installs
                    signal.signal(sig, signal.default_int_handler)  # its handler (a cancellation of the
                continue  # main task, not a KeyboardInterrupt raised wherever the loop is, its own close too)
            if sig == _SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # nohup: the hangup stays ignored
            self._previous[sig] = signal.signal(sig, self._as_interrupt)

    def _as_interrupt(self, signum: int, frame: FrameType | None) -> None:
        from asyncroll.cli_signals import record

        self.received = self.received or signal.Signals(signum).name
        record(signal.Signals(signum).name)  # for the CLI: an exception it surfaces as names this signal
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # SIGINT ignored or left to the OS: interrupt all the same
            raise KeyboardInterrupt(self.received)
        # Python's raises KeyboardInterrupt; asyncio's cancels the run's main task
        handler(signum, frame)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.received = self.received or signal.Signals(signum).name

    def hold(self) -> None:
        """From now on a stop signal is recorded only: the run's outcome is final."""
        if threading.current_thread() is not threading.main_thread() or self._held:
            return
        self._held = True
        for sig in STOP_SIGNALS:  # what was there at the start is what restore() puts back: not a
            if sig == _SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # handler of an event loop that has ended; nohup's hangup stays ignored
            previous = signal.signal(sig, self._record)
            self._previous.setdefault(sig, previous)

    def restore(self) -> None:
        """Put the handlers back; after :meth:`hold`, the CLI's own (which raises KeyboardInterrupt) stays
        replaced by the recording one until the CLI's exit takes over (``leave_with``): a signal while the
        command returns through click exited 130 after a complete run, or with a traceback."""
        if threading.current_thread() is not threading.main_thread():
            return
        from asyncroll.cli_signals import is_guard

        for sig, previous in self._previous.items():
            if not (self._held and is_guard(previous)):
                put_back(sig, previous)
        self._previous = {}
