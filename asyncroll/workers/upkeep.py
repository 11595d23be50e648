"""A tool worker's upkeep of its own process: what every job finds (working directory, stdio), the
orphans it reaps between jobs, the descendants it ends when it closes, its resident memory (read after a
job when asked), and the Linux process flags it sets at start (death with its parent, child subreaper).
Stdlib only at import (the worker imports it at start-up); psutil is imported only when a descendant is
left at close.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

ORPHAN_ZOMBIES = 32
"""Exited orphans outside the worker's process group that may wait, unreaped, between jobs."""
CLOSE_GRACE_S = 0.2
"""At close, descendants still running this long after SIGTERM get SIGKILL."""
CLOSE_LIMIT_S = 0.6
"""At close, stop trying after this long (inside the runtime's 1 s wait; it then kills the tree)."""
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36  # Linux >= 3.4
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Baseline:
    """What every job finds as the worker had it once its tools were imported, whatever an earlier job
    (of another trajectory, perhaps) did to it: the working directory, and fds 0, 1 and 2 (/dev/null and
    the worker's log). A tool that ``chdir``-ed into a temporary directory and raised, or closed its
    stdout, would otherwise make every later call in this worker read and write elsewhere, or fail at
    its first ``print``. Module state (``sys.path`` and ``sys.modules`` included) is the tools' and
    persists."""

    def __init__(self) -> None:
        self.cwd_fd: int | None = None
        try:
            self.cwd: str | None = os.getcwd()
        except OSError:  # the runtime's directory was removed (a cleaned scratch folder): held by an fd
            self.cwd = None  # (getcwd made every replacement worker exit at its dummy call: a failed run)
            with contextlib.suppress(OSError):
                self.cwd_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        self.std = [(fd, os.dup(fd), _identity(fd)) for fd in (0, 1, 2) if _identity(fd) is not None]

    def restore(self) -> None:
        for fd, saved, identity in self.std:
            if _identity(fd) != identity:
                os.dup2(saved, fd)
        if self.cwd is None:
            if self.cwd_fd is not None and _identity(self.cwd_fd) != _path_identity("."):
                with contextlib.suppress(OSError):
                    os.fchdir(self.cwd_fd)
            return
        try:
            if os.getcwd() == self.cwd:
                return
        except OSError:  # the directory the tool left us in was removed
            pass
        with contextlib.suppress(OSError):  # the worker's own directory is gone: nowhere to return
            os.chdir(self.cwd)


def _identity(fd: int) -> tuple[int, int] | None:
    """The file an fd is open on, or None when it is closed."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _path_identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``, Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def reap_orphans() -> None:
    """Between jobs: once more than :data:`ORPHAN_ZOMBIES` exited children that left this worker's process
    group wait to be reaped, reap them — orphans adopted after a ``setsid``/daemon double fork, which would
    otherwise stay zombies for the worker's life (a tool that detaches a process per call would pile up
    thousands).

    A child in the worker's own group is never reaped here: it may be one a tool started and will wait
    for in a later job (module state); reaping it would steal its exit status (``Popen`` would report 0).
    The same holds for a tool's child in a session of its own (``start_new_session=True``) while fewer than
    :data:`ORPHAN_ZOMBIES` such zombies exist — past that the worker cannot tell them from orphans. An
    orphan that stayed in the group (a double fork without ``setsid``) is reaped when the worker closes.
    Costs one system call when no child has exited; otherwise reads ``/proc`` (Linux: each thread's
    ``children`` list and each child's ``stat``). Elsewhere nothing is adopted, so there is nothing to
    reap."""
    try:
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return  # no child has exited
    except (ChildProcessError, AttributeError, OSError):  # no child at all, or no waitid here
        return
    zombies = [pid for pid, exited in _outside_group() if exited]
    if len(zombies) > ORPHAN_ZOMBIES:
        for pid in zombies:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def outside_children() -> tuple[int, ...]:
    """This worker's children outside its process group, running or exited and unreaped: a tool's child
    in a session of its own, an orphan adopted after a double fork. Each job's reply names them: should
    the worker die they are re-parented to the runtime, and one that has exited by then (or exits before
    the pool looks) is a zombie whose environment, and so origin, is gone and whose session is no
    worker's; nothing else attributes it (a child in the group is found by the worker's session). One
    system call when the worker has no child (the common case); otherwise reads ``/proc`` as
    :func:`reap_orphans` does."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, AttributeError, OSError):  # no child at all, or no waitid here
        return ()
    return tuple(pid for pid, _ in _outside_group())


def _outside_group() -> list[tuple[int, bool]]:
    """(pid, exited) of each child outside this worker's process group (Linux ``/proc``)."""
    own = os.getpgrp()
    found = []
    for pid in _children():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
            if int(fields[2]) != own:
                found.append((pid, fields[0] == b"Z"))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return found


def _children() -> list[int]:
    """PIDs of this process's children, from ``/proc/self/task/*/children`` (empty if unavailable)."""
    pids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        return []
    return pids


def reap_children() -> bool:
    """Reap every child that has exited; return whether any child is left (running or not yet reaped).
    Only when the worker closes: it would steal the exit status of a child a tool still waits for."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def end_descendants(grace: float = CLOSE_GRACE_S, limit: float = CLOSE_LIMIT_S) -> None:
    """SIGTERM every descendant, SIGKILL whatever still runs after ``grace`` seconds, reap them; give up
    after ``limit`` seconds. Orphans made meanwhile are adopted (subreaper) and found on the next pass."""
    if not reap_children():
        return  # no child, so no descendant: the common case costs one system call
    import psutil  # only when something is left: a worker must start without it

    terminated: set[psutil.Process] = set()
    t0 = time.monotonic()
    while (elapsed := time.monotonic() - t0) < limit:
        live = _running_descendants()
        if not live:
            break
        for process in live:
            try:
                if elapsed >= grace:
                    process.kill()
                elif process not in terminated:
                    process.terminate()
                    terminated.add(process)
            except psutil.Error:
                pass
        time.sleep(0.005)
        reap_children()
    reap_children()


def _running_descendants() -> list[psutil.Process]:
    import psutil

    def running(process: psutil.Process) -> bool:
        try:
            return bool(process.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    try:
        return [p for p in psutil.Process().children(recursive=True) if running(p)]
    except psutil.Error:
        return []


def _prctl(option: int, value: int) -> None:
    """Linux ``prctl(option, value)``; nothing elsewhere, or where the C library lacks it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the runtime dies, so a runaway tool cannot outlive it."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def adopt_orphans() -> None:
    """Become a child subreaper (Linux >= 3.4): descendants orphaned by a double fork or ``setsid -f``
    are re-parented to this worker instead of init, so the tree kill finds them. Elsewhere such an
    orphan leaves the tree, and only the process group reaches it."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
