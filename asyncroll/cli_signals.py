"""The CLI process's stop signals (SIGINT, SIGTERM, SIGHUP) outside a command's own handling: from the
first instant of the ``asyncroll`` command (:mod:`asyncroll.__main__`) to the process's exit. A command's
run installs its own handlers on top (:mod:`asyncroll.runtime.signals`, the experiment runner's guard) and
puts these back.

- While the CLI's modules import (:func:`starting`, ≈ 0.3 s: typer, pydantic), each of the three ends the
  process with exit 130 and one line; a Ctrl-C there printed a KeyboardInterrupt traceback from inside
  some import and exited by the signal.

- Before and between those handlers (imports, parsing, validation), each of the three stops the command
  as Ctrl-C does: exit 130, no traceback (:func:`guard`). SIGTERM and SIGHUP used to kill the process
  outright in this stretch (status -15, -1).
- A command that ends with an exception after one of them came ends "interrupted by …" with exit 130,
  its exception on one line (:func:`interrupted_by`): a Ctrl-C during the import of a C extension
  (numpy) surfaces as an ``ImportError``, which printed a traceback and exited 1.
- Once the command is over (:func:`leave_with`) a signal ends the process at once with the command's own
  exit code, through the exit handlers too (one that hangs is ended); from the interpreter's final
  clean-up on, it is ignored. Python puts the default handlers
  back for that clean-up (≈ 0.5 s with scikit-learn and SciPy loaded), so a second Ctrl-C or a SIGTERM
  shortly after the first used to end the process by that signal, against the exit code run.json records.

Only the standard library is imported here: ``asyncroll --help`` stays fast.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

_NAMES = ("SIGINT", "SIGTERM", "SIGHUP")
_received: list[str] = []  # the stop signals this process received since guard(), in order
_ignoring_at_exit: list[bool] = []  # whether guard() registered _ignore_stop_signals (once a process)


def _stop_signals() -> list[signal.Signals]:
    return [sig for name in _NAMES if (sig := getattr(signal, name, None)) is not None]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum).name)
    signal.default_int_handler(signal.SIGINT, frame)  # raises KeyboardInterrupt


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """While the block runs (the CLI's imports), a stop signal ends the process: exit 130, "interrupted by
    SIGINT while starting: nothing done" on stderr, no traceback. A SIGHUP the process was started
    ignoring (``nohup``) stays ignored, as :func:`guard` leaves it; an ignored SIGINT or SIGTERM (a script's
    background job starts with SIGINT ignored) stops it, as it does once :func:`guard` runs. The handlers in
    place before are put back after. Main thread only."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.write(
                2, f"interrupted by {signal.Signals(signum).name} while starting: nothing done\n".encode()
            )
        raise SystemExit(130)

    with _handled_by(stop, keep_nohup=True):
        yield


def put_back(sig: signal.Signals, previous: Any) -> None:
    """Give ``sig`` back the handler :func:`signal.getsignal` or :func:`signal.signal` returned before:
    ``None`` when it was installed from outside Python (C code, an embedding program), which
    :func:`signal.signal` refuses (TypeError); the OS default stands in for it."""
    signal.signal(sig, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def _handled_by(handler: Any, *, keep_nohup: bool = False) -> Iterator[None]:
    """``handler`` takes each stop signal while the block runs; the handlers in place before are put back
    after. ``keep_nohup``: a SIGHUP the process was started ignoring stays ignored. Main thread only
    (a signal's Python handler runs there); elsewhere nothing changes."""
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in _stop_signals():
            if (
                keep_nohup
                and sig == getattr(signal, "SIGHUP", None)
                and signal.getsignal(sig) == signal.SIG_IGN
            ):
                continue
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                break
        yield
    finally:
        for sig, before in previous.items():
            put_back(sig, before)


def guard() -> None:
    """From now on each stop signal is recorded and raises KeyboardInterrupt (which typer, and each
    command, turn into exit 130). Main thread only; elsewhere nothing changes. A SIGHUP this process was
    started ignoring (``nohup``) stays ignored: the caller asked that the terminal's hangup not stop it."""
    _received.clear()
    for sig in _stop_signals():
        if sig == getattr(signal, "SIGHUP", None) and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, _interrupt)
    if not _ignoring_at_exit:  # registered first, so run last (exit handlers run in reverse): every one
        _ignoring_at_exit.append(True)  # the command registers runs before it, under leave_with's handlers
        atexit.register(_ignore_stop_signals)


def record(name: str) -> None:
    """A stop signal a command's own handler took (:class:`asyncroll.runtime.signals.CommandSignals`),
    recorded only under :func:`guard` (a process that runs commands another way keeps no record: a stale
    one would stop its next command at once)."""
    if _ignoring_at_exit:  # guard() ran in this process
        _received.append(name)


def is_guard(handler: object) -> bool:
    """Whether ``handler`` is the one :func:`guard` installed."""
    return handler is _interrupt


def interrupted_by() -> str | None:
    """The first stop signal received since :func:`guard`, if any."""
    return _received[0] if _received else None


def leave_with(code: int) -> None:
    """The command is over and the interpreter is shutting down: a stop signal now (a burst of Ctrl-C)
    exits at once with the command's own code, instead of a KeyboardInterrupt traceback from the
    interpreter's shutdown; it still ends a shutdown that hangs joining a thread or in an exit handler
    (multiprocessing's joins a stuck child). Once the exit handlers registered since :func:`guard` have
    run, the signals are ignored instead: the interpreter's last clean-up would otherwise run under the
    default handlers, and a signal then ended the process by that signal."""

    def leave(_signum: int, _frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    for sig in _stop_signals():
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, leave)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop signal that arrives inside is delivered when the block ends, to the handler in place then:
    for a step a KeyboardInterrupt must not cut in half. One raised inside an event loop's constructor
    left half a loop, whose ``__del__`` later printed an ``AttributeError`` traceback. Main thread only
    (a signal's Python handler runs there); elsewhere nothing changes."""
    pending: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    try:
        with _handled_by(note):
            yield
    finally:
        if pending:  # the first only: one stop is what the handler in place acts on
            signal.raise_signal(pending[0])


def _ignore_stop_signals() -> None:
    """Python resets a handled signal to its default for the final clean-up, but leaves an ignored one
    ignored: the exit code stays the command's."""
    for sig in _stop_signals():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)
