"""The sweep's cell processes (``--jobs`` above 1): how one is set up (it leaves the stop signals to the
sweep and ends with it), started (one that cannot start names the limit), stopped, and what one that died
under the sweep says."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from asyncroll.cpus import usable_cpus as usable_cpus  # bench and the sweep read it here
from asyncroll.errors import SimulationError
from asyncroll.process_limits import limit_note
from asyncroll.runtime.signals import STOP_SIGNALS


def died(pool: ProcessPoolExecutor | None) -> str:
    """What ended the pool: a cell process that died under it (SIGKILL: the OOM killer, say), by its exit
    code (read before the sweep kills the others, which ignore the pool's SIGTERM and still run; waited
    for: its pipe closes a moment before its exit status can be read)."""
    processes, deadline = list((getattr(pool, "_processes", None) or {}).values()), time.monotonic() + 1
    while not (codes := [p.exitcode for p in processes if p.exitcode]) and time.monotonic() < deadline:
        time.sleep(0.01)
    how = f"exit code {codes[0]}" if codes else "its exit code unknown"
    if codes and codes[0] < 0:
        name = next((s.name for s in signal.Signals if s == -codes[0]), f"signal {-codes[0]}")
        how = f"killed by {name}" + (": the OOM killer's signal when memory runs out" * (name == "SIGKILL"))
    return f"a sweep cell process ended abruptly ({how}); the cells it and the others were running are lost"


@contextlib.contextmanager
def starting(jobs: int, semaphores: bool = False) -> Iterator[None]:
    """The sweep's cell processes (and multiprocessing's resource tracker) being started: one that cannot
    start (``ulimit -n`` or ``-u`` reached) is a :class:`SimulationError` that says so, not a traceback.
    ``semaphores``: the pool's making, whose semaphores live in /dev/shm on Linux; sem_open's error names
    no file, so a read-only or missing /dev/shm (a container's, a sandbox's) is named here."""
    try:
        yield
    except OSError as exc:
        note = limit_note(exc)
        where = ""
        if semaphores and not note and exc.filename is None and sys.platform.startswith("linux"):
            where = "cannot make a semaphore in /dev/shm: "
        raise SimulationError(
            f"cannot start the sweep's cell processes (--jobs {jobs}): {where}{exc.strerror or exc}"
            f"{note}; --jobs 1 runs the cells in this process"
        ) from exc


def stop(pool: ProcessPoolExecutor, *, kill: bool) -> None:
    """End the sweep's cell processes. ``kill``: the sweep stops, so the running cells are killed (a
    cell writes nothing, and an unfinished cell's row is dropped anyway) instead of waited for; a signal
    that comes while waiting kills them too. Cells ignore SIGINT, SIGTERM and SIGHUP (the sweep owns
    those), so a wait that a second Ctrl-C cut short used to leave them running and the interpreter's
    exit waiting on them for ever."""
    # ProcessPoolExecutor has no public list of its processes; this attribute exists from 3.8 to 3.13.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    if kill:
        kill_all(processes)
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            return
        except KeyboardInterrupt:
            kill_all(processes)


def finished(futures: list[Future[Any]]) -> list[Any]:
    """The results of the cells among ``futures`` that had finished, in cell order: with cells in several
    processes, a later cell may finish while an earlier one still runs, and its row is as finished."""
    return [f.result() for f in futures if f.done() and not f.cancelled() and f.exception() is None]


def kill_all(processes: list[Any]) -> None:
    for process in processes:
        with contextlib.suppress(Exception):  # already gone
            process.kill()


def cell_process(sweep_pid: int) -> None:
    """Set up a cell process. It leaves Ctrl-C, SIGTERM and SIGHUP (sent to the whole process group, say)
    to the sweep, which stops it when it unwinds; and it ends itself as soon as the sweep is gone however that
    happened (SIGKILL, the OOM killer, a SIGTERM to a script that installed no handler): it ignores
    SIGTERM and holds both ends of its task queue, so nothing else would ever end it."""
    for sig in STOP_SIGNALS:  # SIGINT, SIGTERM and SIGHUP: the sweep's to act on
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked as it started (stop_signals_blocked): dropped now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    threading.Thread(target=exit_with, args=(sweep_pid,), name="sweep-watch", daemon=True).start()


def exit_with(sweep_pid: int, every_s: float = 0.5) -> None:
    while os.getppid() == sweep_pid:
        time.sleep(every_s)
    os._exit(1)
