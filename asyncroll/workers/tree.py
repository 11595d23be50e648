"""A worker's process tree: signal all of it, tell when it is gone, read its CPU time.

A worker leads its own process group, but a tool (or the code evaluator) may start descendants that
call ``setsid`` and leave the group. Signalling the group *and* every descendant psutil finds reaches
both. On Linux the worker is a child subreaper (:mod:`asyncroll.workers.child`), so a descendant whose
parent exited (a double fork, ``setsid -f``) is re-parented to the worker and still found. Descendants
can only be found this way while the worker lives, so a tree is always signalled before the worker is
reaped; once a worker has died, its children are re-parented to the runtime (a child subreaper while
its pool runs) and found by the origin they inherited (:mod:`asyncroll.workers.orphans`).
"""

from __future__ import annotations

import contextlib
import os

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of ``pid`` (empty if ``pid`` is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def signal_tree(leader: int, signum: int, processes: list[psutil.Process]) -> None:
    """Send ``signum`` to the process group ``leader`` leads and to each of ``processes``.

    A process group id stays reserved while any member lives, so ``killpg`` reaches only our group;
    psutil's ``send_signal`` refuses a pid that was reused by another process meanwhile.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)


def all_gone(processes: list[psutil.Process]) -> bool:
    """True when none of ``processes`` still runs (zombies awaiting their reaper count as gone)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid`` and of the children it reaped, or ``None`` if unreadable."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system + times.children_user + times.children_system)
